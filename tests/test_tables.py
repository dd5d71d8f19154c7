"""The header rules every CSV table of runs follows (``ledgerlm.tables``), through both
readers that use them: scaling points (``scale fit --csv``) and mixture tables (``mix
fit --csv``)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from ledgerlm.cli.main import app
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.mixture.table import read_mixture_table
from ledgerlm.scaling.table import read_points
from ledgerlm.tables import read_csv
from reference_data import REFERENCE_CSV

POINTS = "1e8,2e9,3.1\n2e8,2e9,3.0\n4e8,4e9,2.9\n"
MIXTURES = "0.5,0.5,3.1\n0.2,0.8,3.0\n0.9,0.1,2.9\n"


def _points(path):
    t = read_points(path)
    return t.columns, np.c_[t.N, t.D, t.loss], t.lines.tolist()


def _mixtures(path):
    t = read_mixture_table(path, "loss")
    return t.domains, np.c_[t.weights, t.target], None


READERS = {  # reader, a header, rows for it
    "points": (_points, "N,D,loss", POINTS),
    "mixtures": (_mixtures, "web,code,loss", MIXTURES),
}


@pytest.fixture(params=list(READERS))
def reader(request):
    return READERS[request.param]


def test_a_byte_order_mark_and_spaces_around_names_are_accepted(tmp_path, reader):
    read, header, rows = reader
    plain = tmp_path / "plain.csv"
    plain.write_text(f"{header}\n{rows}")
    spaced = tmp_path / "spaced.csv"  # as Excel saves it, names padded after commas
    spaced.write_bytes(b"\xef\xbb\xbf" + f"{header.replace(',', ', ')} \n{rows}".encode())
    names, values, lines = read(spaced)
    assert (names, lines) == read(plain)[::2]
    np.testing.assert_array_equal(values, read(plain)[1])


def test_a_name_given_twice_is_refused_with_both_positions(tmp_path, reader):
    read, header, rows = reader
    path = tmp_path / "runs.csv"
    path.write_text(f"{header},loss\n" + "".join(f"{r},2.0\n" for r in rows.splitlines()))
    with pytest.raises(ValueError) as info:
        read(path)
    assert str(info.value) == f"{path}:1: column 'loss' appears twice (columns 3 and 4)"


def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path, reader):
    read, header, rows = reader
    path = tmp_path / "runs.csv"
    first, *rest = rows.splitlines()
    path.write_bytes(f"{header}\n{first}\n".encode() + b"3.0\xe9," + "\n".join(rest).encode())
    with pytest.raises(ValueError) as info:
        read(path)
    offset = len(f"{header}\n{first}\n") + 4  # the byte after "3.0", from 1
    assert str(info.value) == (
        f"{path}:3: byte 0xe9 at column 4 (byte {offset} of the file) is not UTF-8; save "
        "the table as UTF-8 text"
    )


def test_read_csv_keeps_lines_and_strips_cells(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('\na,  "b, c" \n1, 2\n\n 3 ,4\n')
    t = read_csv(path)
    assert (t.header_line, t.header) == (2, ["a", "b, c"])
    assert t.rows == [(3, ["1", "2"]), (5, ["3", "4"])] and t.column("b, c") == 1
    for text, error in [
        ("", ": empty file"),
        ("1,2\n3,4\n", ":1: no header"),
        ("a,,b\n1,2,3\n", ":1: column 2 of the header has no name"),
        ("a,b\n1,2,3\n", ":2: 3 fields where the header has 2"),
        ("a,b\n", ": no rows after the header"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError) as info:
            read_csv(path)
        assert str(info.value).startswith(f"{path}{error}"), text
    with pytest.raises(ValueError, match="no such file"):
        read_csv(tmp_path / "absent.csv")


def test_scale_fit_names_the_file_of_a_table_too_short_or_badly_headed(tmp_path):
    runner = CliRunner()
    cases = {
        "dup.csv": ("N,D,loss,loss\n1e8,2e9,3.1,3.0\n", ":1: column 'loss' appears twice"),
        "none.csv": ("N,D,loss\n", ": no rows after the header"),
        "one.csv": ("N,D,loss\n1e8,2e9,3.1\n", ": the fit of E, A, B, alpha, beta needs"),
        "two.csv": ("N,D,loss\n1e8,2e9,3.1\n2e8,2e9,3.0\n", ": the fit of E, A, B"),
        "huge.csv": ("N,D,loss\n1e8,2e9,3.1\n2e8,2e9,1e300\n", ":3: column 'loss': '1e300' is"),
    }
    for name, (text, error) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        result = runner.invoke(app, ["scale", "fit", "--csv", str(path)])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}{error}"), result.stderr


def test_the_budget_column_is_read_with_the_points(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(" N , D , loss , budget\n1e8,2e9,3.1,6e18\n2e8,2e9,3.0,6e18\n")
    points = load_points(csv=path, columns={"budget_col": "budget"})
    assert points.budget.tolist() == [6e18, 6e18] and points.labels == ["line 2", "line 3"]
    assert points.select(np.array([1])).budget.tolist() == [6e18]
    path.write_text("N,D,loss,budget\n1e8,2e9,3.1,6e18\n2e8,2e9,3.0,x\n")
    with pytest.raises(ValueError, match=r"runs\.csv:3: column 'budget': 'x' is not a positive"):
        load_points(csv=path, columns={"budget_col": "budget"})
    with pytest.raises(ValueError, match=r"runs\.csv:1: no column 'C' for the isoFLOP budget"):
        load_points(csv=path, columns={"budget_col": "C"})


def test_the_chinchilla_table_saved_with_a_bom_and_spaces_reads_the_same(tmp_path):
    if not REFERENCE_CSV.exists():
        pytest.skip(f"reference data absent: {REFERENCE_CSV}")
    lines = REFERENCE_CSV.read_text().splitlines()
    path = tmp_path / "chinchilla.csv"
    path.write_text("\ufeff" + lines[0].replace(",", ", ") + "\n" + "\n".join(lines[1:]) + "\n")
    a, b = read_points(REFERENCE_CSV), read_points(path)
    assert a.columns == b.columns and len(b.N) == 245
    np.testing.assert_array_equal(np.c_[a.N, a.D, a.loss], np.c_[b.N, b.D, b.loss])
