"""A table of proxy runs read from CSV: domains, target and run names; weights
renormalized within their tolerance or printed rounding; one-line errors naming the file
and the line."""

from __future__ import annotations

import csv
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ledgerlm.errors import ArgumentError
from ledgerlm.mixture import table as table_module
from ledgerlm.mixture.table import read_mixture_table


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def test_reads_domains_target_and_run_names(tmp_path):
    path = tmp_path / "runs.csv"
    write_csv(
        path,
        ["run", "web", "code", "loss", "seed", "math"],
        [
            ["r1", "0.5", "0.3", "2.5", "1", "0.2"],
            ["r2", "0.2", "0.2", "2.7", "2", "0.6"],
            ["r3", "0.1", "0.8", "2.6", "3", "0.1"],
        ],
    )
    t = read_mixture_table(path, "loss", ignore=["seed"])
    assert t.domains == ["web", "code", "math"] and t.target_name == "loss"
    np.testing.assert_allclose(t.weights, [[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]])
    np.testing.assert_allclose(t.target, [2.5, 2.7, 2.6])
    assert t.names == ["r1", "r2", "r3"] and t.warnings == []
    # the --predict file: exactly the given domains, in their order; no target needed
    p = read_mixture_table(path, None, domains=["math", "web", "code"])
    np.testing.assert_allclose(p.weights[:2], [[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]])
    assert p.target is None and p.names == ["r1", "r2", "r3"]


def test_rows_within_the_tolerance_are_renormalised(tmp_path):
    path = tmp_path / "runs.csv"
    rows = [["0.5004", "0.5", "1"], ["0.2", "0.7995", "2"], ["0.5", "0.5", "3"]]
    write_csv(path, ["a", "b", "y"], rows)
    t = read_mixture_table(path, "y")
    np.testing.assert_allclose(t.weights.sum(axis=1), 1.0, atol=1e-15)
    assert t.names is None and t.warnings == []  # within 1e-3: renormalized silently


@pytest.mark.parametrize(
    ("text", "decimals"),
    [("0.334", 3), ("0.50", 2), ("1", 0), ("1.", 0), (".5", 1), ("2.5e-4", 5), ("3E+2", 0)],
)
def test_printed_decimals_are_read_from_the_text(text, decimals):
    assert table_module.printed_decimals(text) == decimals


def test_weights_are_renormalized_within_the_rounding_of_their_printed_decimals(tmp_path):
    # 0.30 + 0.30 + 0.41 = 1.01: within 3 weights x 0.005 at 2 decimals, counted ...
    path = tmp_path / "runs.csv"
    path.write_text("a,b,c,y\n0.30,0.30,0.41,1\n3.0e-1,3.3e-1,3.6e-1,2\n0.334,0.333,0.334,3\n")
    t = read_mixture_table(path, "y")
    np.testing.assert_allclose(t.weights[0], np.array([0.30, 0.30, 0.41]) / 1.01, rtol=1e-15)
    np.testing.assert_allclose(t.weights.sum(axis=1), 1.0, rtol=1e-15)
    assert t.warnings == [  # 0.334 + 0.333 + 0.334 = 1.001: within 1e-3, not counted
        f"{path}: renormalized 2 of 3 rows whose weights sum to 1 only within their "
        "2-decimal rounding (sums 0.99 to 1.01)"
    ]
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(
        "a,b,c,d,e,y\n0.2,0.2,0.2,0.2,0.21,1\n0.201,0.2,0.2,0.2,0.201,2\n0.2,0.2,0.2,0.2,0.2,3\n"
    )
    assert read_mixture_table(mixed, "y").warnings == [
        f"{mixed}: renormalized 2 of 3 rows whose weights sum to 1 only within their "
        "2- to 3-decimal rounding (sums 1.002 to 1.01)"
    ]
    # ... but the same numbers printed to 3 decimals are refused: 3 x 0.0005 < 0.01
    path.write_text("a,b,c,y\n0.5,0.25,0.25,1\n0.300,0.300,0.410,2\n0.5,0.5,0,3\n")
    with pytest.raises(ValueError) as info:
        read_mixture_table(path, "y")
    assert str(info.value).startswith(
        f"{path}:3: the weights sum to 1.01, not 1 (tolerance 0.0015 for 3 weights at 3 decimals;"
    )
    # weights printed without decimals are exact (0 or 1), not rounded
    path.write_text("a,b,c,y\n1,1,0,1\n0.5,0.5,0,2\n0.5,0.5,0,3\n")
    with pytest.raises(
        ValueError, match=r"runs\.csv:2: the weights sum to 2, not 1 \(tolerance 0\.001;"
    ):
        read_mixture_table(path, "y")


def test_a_regression_table_of_fewer_than_3_rows_names_the_file(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("a,b,y\n0.5,0.5,1\n0.25,0.75,2\n")
    with pytest.raises(ValueError) as info:
        read_mixture_table(path, "y")
    assert str(info.value) == (
        f"{path}: 2 rows after the header; a mixture regression needs at least 3 (one per run)"
    )
    assert read_mixture_table(path, None, ["y"]).weights.shape == (2, 2)  # to predict


def test_line_numbers_count_the_header_and_blank_lines(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("\ufeffa,b,y\n0.5,0.5,1\n\n0.5,0.6,2\n")  # a BOM; a blank line 3
    with pytest.raises(ValueError, match=r"runs\.csv:4: the weights sum to 1\.1, not 1"):
        read_mixture_table(path, "y")


BAD_TABLES = [  # (file text, target, the error after "<path>")
    ("", "y", ": empty file"),
    ("0.5,0.5,1\n0.5,0.5,2\n", "y", ":1: no header"),
    ("a,b,y\n", "y", ": no rows after the header"),
    ("a,b,y\n0.5,0.5,1\n", "loss", ":1: target column 'loss' is not in the header"),
    ("a,a,y\n0.5,0.5,1\n", "y", ":1: column 'a' appears twice"),
    ("a,,y\n0.5,0.5,1\n", "y", ":1: column 2 of the header has no name"),
    ("a,b,y\n0.5,0.5\n", "y", ":2: 2 fields where the header has 3"),
    (
        "a,b,y\n0.5,0.5,1\n0.5,x,1\n0.5,0.5,1\n",
        "y",
        ":3: weight 'x' is not a number for domain 'b'",
    ),
    ("a,b,y\n0.5,0.5,1\n0.5,,1\n", "y", ":3: no weight for domain 'b'"),
    ("a,b,y\n1.5,-0.5,1\n", "y", ":2: weight -0.5 of domain 'b' is negative"),
    ("a,b,y\n0.5,nan,1\n", "y", ":2: weight 'nan' of domain 'b' is not finite"),
    ("a,b,y\n0.5,0.5,\n", "y", ":2: target 'y': missing"),
    ("a,b,y\n0.5,0.5,inf\n", "y", ":2: target 'y': 'inf' is not finite"),
    ("a,b,y\n0.5,0.5,abc\n", "y", ":2: target 'y': 'abc' is not a number"),
    ("a,name,y\n1,x,1\n", "y", ":1: 1 domain weight column (a); a mixture needs at least 2"),
]


@pytest.mark.parametrize(("text", "target", "message"), BAD_TABLES)
def test_bad_tables_are_one_line_errors_naming_file_and_line(tmp_path, text, target, message):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        read_mixture_table(path, target)
    assert str(info.value).startswith(f"{path}{message}")
    assert "\n" not in str(info.value)


def test_missing_file_unknown_ignore_and_missing_domain(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.csv: no such file"):
        read_mixture_table(tmp_path / "nope.csv", "y")
    path = tmp_path / "runs.csv"
    write_csv(path, ["a", "b", "y"], [["0.5", "0.5", "1"]])
    with pytest.raises(ArgumentError, match=r":1: ignore column 'seed' is not in the header"):
        read_mixture_table(path, "y", ignore=["seed"])
    with pytest.raises(ArgumentError, match=r":1: target column 'loss' is not in the header"):
        read_mixture_table(path, "loss")
    with pytest.raises(ValueError, match=r":1: no column for domain 'c'"):
        read_mixture_table(path, None, domains=["a", "c"])
    with pytest.raises(ValueError, match="is a folder"):
        read_mixture_table(tmp_path, "y")


# Column names a user might write: letters, digits, spaces, commas and quotes inside
# (the csv module quotes them), never a number, never padded (cells are stripped).
names = st.text(st.sampled_from("abcxyz019 _-,\"'[]/"), min_size=0, max_size=8).map(
    lambda s: "d" + s.strip()
)


@st.composite
def tables(draw):
    k = draw(st.integers(2, 6))
    domains = draw(st.lists(names, min_size=k, max_size=k, unique=True))
    n = draw(st.integers(3, 12))  # a regression's table: at least 3 rows
    raw = draw(
        st.lists(
            st.lists(st.floats(0, 1, allow_subnormal=False), min_size=k, max_size=k).filter(
                lambda r: sum(r) > 1e-6
            ),
            min_size=n,
            max_size=n,
        )
    )
    w = np.array(raw)
    w /= w.sum(axis=1, keepdims=True)
    y = draw(st.lists(st.floats(-1e6, 1e6), min_size=n, max_size=n))
    return domains, w, np.array(y)


def _write_table(path, domains, w, y):
    header = ["run name", *domains, "target value"]
    rows = [
        [f"run {i}", *map(repr, map(float, r)), repr(float(v))]
        for i, (r, v) in enumerate(zip(w, y, strict=True))
    ]
    write_csv(path, header, rows)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(table=tables())
def test_tables_of_valid_mixtures_round_trip(tmp_path, table):
    domains, w, y = table
    path = tmp_path / "t.csv"
    _write_table(path, domains, w, y)
    t = read_mixture_table(path, "target value")
    assert t.domains == domains and t.target_name == "target value"
    np.testing.assert_allclose(t.weights, w, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(t.target, y)
    assert t.names == [f"run {i}" for i in range(len(w))]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    table=tables(),
    data=st.data(),
    off=st.floats(0.0011, 0.15) | st.floats(-0.15, -0.0011),
)
def test_a_row_off_by_more_than_the_tolerance_is_refused_with_its_line(tmp_path, table, data, off):
    domains, w, y = table
    row = data.draw(st.integers(0, len(w) - 1))
    j = int(np.argmax(w[row]))  # the largest weight (>= 1/6) can give up to 0.15
    w = w.copy()
    w[row, j] += off
    # ... and by more than the rounding of the row as printed (say 0.6 beside 0.5 could
    # be 0.55 and 0.45 rounded to 1 decimal: 2 weights x half a unit of the 1st decimal)
    printed = [Decimal(repr(float(x))) for x in w[row]]
    decimals = max(max(0, -int(x.as_tuple().exponent)) for x in printed)
    assume(abs(sum(printed) - 1) >= len(printed) * Decimal("0.5") / 10**decimals)
    path = tmp_path / "t.csv"
    _write_table(path, domains, w, y)
    with pytest.raises(ValueError, match=rf"t\.csv:{row + 2}: the weights sum to "):
        read_mixture_table(path, "target value")
