"""``FitTable`` at a console's width: its three layouts, chosen by what fits, never cut a
cell, and read rich markup as the CLI's tables give it (escaped text)."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.markup import escape

from ledgerlm.cli.table import FitTable, fit_widths

RUN = "tiny-sweep-3f9a1c-N200k-D409k-20261201-211131-43f5"


def render(table: FitTable, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as captured:
        console.print(table)
    lines = captured.get().splitlines()
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    assert "…" not in "\n".join(lines)
    return [line.rstrip() for line in lines]


def runs_table(ids: list[str]) -> FitTable:
    t = FitTable(title="runs")
    t.add_column("run")
    t.add_column("created", no_wrap=True)
    t.add_column("status")
    for col in ("data", "tokens"):
        t.add_column(col, no_wrap=True)
    for run_id in ids:
        t.add_row(escape(run_id), "2026-12-01 21:01:36", "finished", "4c39005098d7", "ac034b4b")
    return t


def test_widths_give_way_from_the_widest_and_never_below_a_word():
    assert fit_widths([(3, 5), (4, 10)], 20) == [5, 10]  # everything fits
    assert fit_widths([(3, 5), (4, 10)], 12) == [5, 7]  # the widest wraps first
    assert fit_widths([(3, 9), (4, 9), (2, 2)], 14) == [6, 6, 2]  # alike columns alike
    assert fit_widths([(3, 5), (9, 10)], 11) is None  # the words do not fit


def test_a_table_that_fits_is_one_table_with_every_cell_whole():
    lines = render(runs_table(["tiny-20261201-43f5"]))  # 79 columns
    assert "tiny-20261201-43f5" in lines[3] and "2026-12-01 21:01:36" in lines[3]
    assert len(lines) == 4  # title, header, rule, the row


def test_a_long_first_column_goes_on_a_line_of_its_own():
    long = "x" * 90 + "-20261201-211131-43f5"  # wider than the console: it folds
    lines = render(runs_table([RUN, long]))
    assert lines[0] == "runs" and lines[1] == "run"
    assert lines[4] == RUN
    row = lines[5]
    assert row.startswith("  ") and "2026-12-01 21:01:36" in row and "finished" in row
    assert "".join(lines[6:8]) == long and lines[8].lstrip().startswith("2026-12-01")


def test_too_many_columns_become_one_block_per_row():
    t = FitTable(title="time to target")
    cols = ["run", "seed", "time to target", "tokens", "s/step", "prep", "tokenize", "eval"]
    cols += ["checkpoint", "vs baseline", "updates", escape("[red]x")]
    for col in cols:
        t.add_column(col, justify="left" if col == "run" else "right")
    t.add_row(RUN, "0", "[red]not reached[/] (final 2.4825)", "1,024,000", *["0.1234"] * 8)
    lines = render(t)
    assert lines[:2] == ["time to target", f"run: {RUN}"]
    assert "  time to target: not reached (final 2.4825)" in lines
    assert "  tokens:         1,024,000" in lines and "  [red]x:         0.1234" in lines
    assert len(lines) == 2 + len(cols) - 1


def test_a_value_too_long_beside_its_header_goes_below_it():
    path = "/data/" + "a" * 70 + "/python-library-reference.jsonl"  # > 80 columns
    t = FitTable()
    for col in ("step", "source", "domain", "dropped"):
        t.add_column(col)
    t.add_row("length", escape(path), "code", "5/5")
    lines = render(t)
    assert lines[:2] == ["step: length", "  source:"]
    assert "".join(lines[2:4]) == path  # folded, not indented: whole once joined
    assert lines[4].split() == ["domain:", "code"]


def test_a_header_breaks_after_a_slash_when_the_columns_are_tight():
    t = FitTable()
    for col in ("step", "tokens", "snapshot", "loss", "loss/code", "loss/docs", "loss/math"):
        t.add_column(col, justify="right")
    t.add_column("bpb", justify="right")
    t.add_row("20", "1,024,000", "4088ffaee4", *["5.3368"] * 5)
    lines = render(t)
    assert "loss/" in lines[0] and "code" in lines[1] and "1,024,000" in lines[3]


@pytest.mark.parametrize("width", [80, 40, 24])
def test_markup_like_text_prints_as_itself_in_every_layout(width):
    t = FitTable(title=escape("[/bold] runs"))
    t.add_column(escape("[red]x"))
    t.add_column("value", justify="right")
    t.add_row(escape("[/bold]" + "y" * 12), "1,024")
    text = "\n".join(render(t, width))
    assert "[/bold] runs" in text and "[red]x" in text and "[/bold]" + "y" * 12 in text
