"""``FitTable``: a rich table that never cuts a cell, whatever the console's width.

Rich fits a table that is too wide by shrinking its widest columns and then every
column evenly, cutting cells with an ellipsis (``sha…``, ``1,024,0…``) or giving a
column no width at all; when stdout is not a terminal it assumes 80 columns. A
``FitTable`` chooses its column widths itself, in three layouts tried in turn:

1. one table whose columns are as wide as their longest word (a column marked
   ``no_wrap``: its longest cell) at least, the widest columns wrapping at spaces
   (a header also after a slash: ``loss/`` over ``code``);
2. the first column (a run id, say) on a line of its own above each row, the other
   columns as a table indented beneath, when only that column does not fit;
3. one block per row: the first cell as a heading, then ``header: value`` lines.

A word longer than the whole console (only an id can be) folds onto the next line
rather than being cut.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Column, Table
from rich.text import Text

INDENT = 2  # columns under a heading (layouts 2 and 3)
_COPIED = ("justify", "no_wrap", "style", "header_style", "vertical")


class FitTable(Table):
    """A ``rich.table.Table`` (no outer edge unless asked) whose cells are never cut."""

    def __init__(self, *args: Any, show_edge: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, show_edge=show_edge, **kwargs)

    def add_column(self, header: RenderableType = "", **kwargs: Any) -> None:
        """As rich's, but folding rather than cutting; the first column (what names a
        row: a run, a step, a point) does not wrap unless told to."""
        kwargs.setdefault("overflow", "fold")
        kwargs.setdefault("no_wrap", not self.columns)
        super().add_column(header, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        ranges = [_column_range(console, options, self.show_header, c) for c in self.columns]
        widths = fit_widths(ranges, width - self._overhead(len(self.columns)))
        if widths is not None or not self.rows:
            yield from _with_widths(self, widths or [hi for _, hi in ranges], console, options)
            return
        rest = ranges[1:]
        under = fit_widths(rest, width - INDENT - self._overhead(len(rest)))
        if under is not None and len(self.columns) > 1:
            yield from self._headed(under)
        else:
            yield from self._blocks(console, options)

    def _overhead(self, n: int) -> int:
        """Padding and rules around ``n`` columns' content."""
        _, right, _, left = self.padding
        pad = n * (left + right) - (0 if self.pad_edge else left + right)
        rules = (n - 1 + (2 if self.show_edge else 0)) if self.box else 0
        return pad + rules

    def _title(self) -> Iterator[RenderableType]:
        if self.title:
            yield _text(self.title, "table.title")

    def _headed(self, widths: list[int]) -> Iterator[RenderableType]:
        """Layout 2: the first cell of each row on its own line, the rest beneath it."""
        yield from self._title()
        first, rest = self.columns[0], self.columns[1:]
        if self.show_header:
            yield _text(first.header, "table.header")
            yield _indent(self._copy(rest, [], widths, header=True))
        for cells in zip(*(c.cells for c in self.columns), strict=True):
            yield _text(cells[0], first.style)
            row = self._copy(rest, [cells[1:]], widths, header=False)
            yield _indent(row)

    def _blocks(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        """Layout 3: per row, the first cell as a heading and ``header: value`` lines; a
        value with a word too long to sit beside its header goes on lines of its own."""
        yield from self._title()
        first, rest = self.columns[0], self.columns[1:]
        keys = [_text(c.header, None).append(":") for c in rest]
        key_width = max((k.cell_len for k in keys), default=0)
        beside = options.max_width - INDENT - key_width - 1
        for cells in zip(*(c.cells for c in self.columns), strict=True):
            heading = _text(cells[0], "bold")
            if first.header and self.show_header:
                heading = Text.assemble(_text(first.header, "bold"), ": ", heading)
            yield heading
            grid = None
            for key, cell in zip(keys, cells[1:], strict=True):
                value = _renderable(console, cell)
                longest = Measurement.get(console, options, value).minimum
                if longest <= beside:
                    grid = grid or _grid(key_width)
                    grid.add_row(key, value)
                    continue
                if grid is not None:
                    yield _indent(grid)
                    grid = None
                yield _indent(Text.assemble(key, style="table.header"))
                indent = 2 * INDENT if longest <= options.max_width - 2 * INDENT else 0
                yield _indent(_text(cell, None), indent)
            if grid is not None:
                yield _indent(grid)

    def _copy(
        self,
        columns: Sequence[Column],
        rows: list[Sequence[RenderableType]],
        widths: list[int],
        header: bool,
    ) -> Table:
        """A plain table of these columns at these content widths."""
        t = Table(
            box=self.box,
            show_edge=self.show_edge,
            show_header=header,
            padding=self.padding,
            pad_edge=self.pad_edge,
            header_style=self.header_style,
        )
        for column, w in zip(columns, widths, strict=True):
            t.add_column(
                _header(column.header, w),
                width=w,
                overflow="fold",
                **{k: getattr(column, k) for k in _COPIED},
            )
        for row in rows:
            t.add_row(*row)
        return t


def fit_widths(ranges: Sequence[tuple[int, int]], room: int) -> list[int] | None:
    """Content widths for columns of (minimum, maximum) widths within ``room``, or None
    when even their minimums do not fit. The widest columns give way first: every
    column is as wide as ``level`` allows (its minimum at least, its maximum at most),
    for the highest level that fits."""
    if sum(lo for lo, _ in ranges) > room:
        return None
    if sum(hi for _, hi in ranges) <= room:
        return [hi for _, hi in ranges]
    level = max(hi for _, hi in ranges)
    while sum(min(max(level, lo), hi) for lo, hi in ranges) > room:
        level -= 1
    return [min(max(level, lo), hi) for lo, hi in ranges]  # alike columns stay alike


def _column_range(
    console: Console, options: ConsoleOptions, header: bool, column: Column
) -> tuple[int, int]:
    """(minimum, maximum) content width of a column: its longest word, its longest line
    (a ``no_wrap`` column: its longest line for both); ``min_width`` counts."""
    wide = options.update_width(1 << 20)  # measure cells unclamped
    lo = hi = 1
    if header:
        text = _renderable(console, column.header)
        lo, hi = _grow(lo, hi, Measurement.get(console, wide, text))
        if isinstance(text, Text):  # a header breaks after a slash too
            lo = max(len(part) for part in ["-", *_SLASHED.findall(text.plain)])
    for cell in column.cells:
        lo, hi = _grow(lo, hi, Measurement.get(console, wide, _renderable(console, cell)))
    if column.no_wrap:
        lo = hi
    if column.min_width:
        lo, hi = max(lo, column.min_width), max(hi, column.min_width)
    return lo, hi


def _grow(lo: int, hi: int, m: Measurement) -> tuple[int, int]:
    return max(lo, m.minimum), max(hi, m.maximum)


def _renderable(console: Console, cell: RenderableType | None) -> RenderableType:
    if cell is None:
        return ""
    return console.render_str(cell, highlight=False) if isinstance(cell, str) else cell


_SLASHED = re.compile(r"[^\s/]*/|[^\s/]+")  # the parts of words, each slash kept


def _indent(renderable: RenderableType, columns: int = INDENT) -> Padding:
    return Padding(renderable, (0, 0, 0, columns), expand=False)


def _grid(key_width: int) -> Table:
    """Two columns: ``header:`` and the value, folding rather than cutting."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, style="table.header", min_width=key_width)
    grid.add_column(overflow="fold")
    return grid


def _header(header: RenderableType, width: int) -> RenderableType:
    """A header whose words are wider than ``width`` broken after slashes, as few times
    as they fit (rich wraps only at spaces)."""
    text = Text.from_markup(header) if isinstance(header, str) else header
    if not isinstance(text, Text):
        return header
    cuts = []
    for word in re.finditer(r"\S+", text.plain):
        start = word.start()
        for part in _SLASHED.finditer(text.plain, word.start(), word.end()):
            if part.end() - start > width and part.start() > start:
                cuts.append(part.start())
                start = part.start()
    if not cuts:
        return header
    bounds = [0, *cuts, len(text.plain)]
    return Text("\n").join(text[a:b] for a, b in pairwise(bounds))


def _text(cell: RenderableType | None, style: Any) -> Text:
    """A cell or header as text (markup read), folding rather than cutting."""
    text = cell.copy() if isinstance(cell, Text) else Text.from_markup(str(cell or ""))
    if style:
        text.stylize(style)
    text.overflow = "fold"
    return text


def _with_widths(
    table: Table, widths: list[int], console: Console, options: ConsoleOptions
) -> RenderResult:
    """Layout 1: rich's own rendering at the content widths chosen here."""
    saved = [(c.width, c.header) for c in table.columns]
    for column, w in zip(table.columns, widths, strict=True):
        column.width, column.header = w, _header(column.header, w)
    try:
        yield from Table.__rich_console__(table, console, options)
    finally:
        for column, (w, header) in zip(table.columns, saved, strict=True):
            column.width, column.header = w, header
