"""CSV tables with a header line: the reading rules every table of runs shares.

``read_csv`` reads a UTF-8 file (a byte-order mark is dropped) with the ``csv`` module
and keeps, for the header and each non-blank row, its line in the file (the header is
line 1 unless blank lines precede it) and its cells with surrounding spaces stripped
(a quote after a comma and spaces still opens a quoted cell), so ``N, D, loss`` names
the columns ``N``, ``D`` and ``loss``. It refuses, with one
line naming the file and the line: bytes that are not UTF-8 (with their column), a
header of numbers (no header), a column without a name or with the name of another
column (both positions), a row with more or fewer fields than the header, and a table
without rows. What the cells mean is the caller's business.

``scan_csv`` reads the header alike and hands the rows over one at a time (the same
rules, checked as they come), for a reader that keeps only numbers: a table of a
million rows is then never held as text.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CsvTable:
    """A header and its rows, each with its line in the file."""

    path: Path
    header_line: int
    header: list[str]
    rows: list[tuple[int, list[str]]]  # (line, cells), cells stripped, blank rows left out

    def column(self, name: str) -> int:
        """The index of the column named ``name`` (names are unique)."""
        return self.header.index(name)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError) -> ValueError:
    """The first byte that is not UTF-8, by line and column (bytes from 1)."""
    start = exc.start
    line = data.count(b"\n", 0, start) + 1
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    return ValueError(
        f"{path}:{line}: byte 0x{data[start]:02x} at column {column} (byte {start + 1} of "
        "the file) is not UTF-8; save the table as UTF-8 text"
    )


def _records(path: Path) -> Iterator[tuple[int, list[str]]]:
    """The file's non-blank records as (line, stripped cells), read as they are needed."""
    try:
        f = path.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not a CSV file") from None
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    with f:
        reader = csv.reader(f, skipinitialspace=True)
        try:
            for cells in reader:
                cells = [c.strip() for c in cells]
                if any(cells):
                    yield reader.line_num, cells
        except csv.Error as exc:
            raise ValueError(f"{path}:{reader.line_num}: {exc}") from None
        except UnicodeDecodeError:  # where, in the file's bytes (read again only now)
            data = path.read_bytes()
            try:
                data.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise _not_utf8(path, data, exc) from None
            raise
        except OSError as exc:
            raise ValueError(f"{path}: {exc.strerror or exc}") from None


def _check_header(path: Path, line: int, header: list[str]) -> None:
    where = f"{path}:{line}"
    if all(_is_number(c) for c in header if c):
        raise ValueError(f"{where}: no header: the first line holds numbers, not column names")
    first: dict[str, int] = {}
    for i, name in enumerate(header, 1):
        if not name:
            raise ValueError(f"{where}: column {i} of the header has no name")
        if name in first:
            raise ValueError(
                f"{where}: column {name!r} appears twice (columns {first[name]} and {i})"
            )
        first[name] = i


@dataclass(frozen=True)
class CsvRows:
    """A header, and the rows after it read one at a time: ``for line, cells in rows``
    (once). A row with more or fewer fields than the header, and a table without rows,
    are refused when the iteration reaches them."""

    path: Path
    header_line: int
    header: list[str]
    records: Iterator[tuple[int, list[str]]]

    def column(self, name: str) -> int:
        """The index of the column named ``name`` (names are unique)."""
        return self.header.index(name)

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        width, empty = len(self.header), True
        for line, cells in self.records:
            if len(cells) != width:
                raise ValueError(
                    f"{self.path}:{line}: {len(cells)} fields where the header has {width}"
                )
            empty = False
            yield line, cells
        if empty:
            raise ValueError(f"{self.path}: no rows after the header (one row per line expected)")


def scan_csv(path: str | Path) -> CsvRows:
    """The header of the CSV file ``path``, checked, and its rows to read one at a time
    (see the module for the rules)."""
    path = Path(path)
    records = _records(path)
    first = next(records, None)
    if first is None:
        raise ValueError(f"{path}: empty file (expected a header line, then one row per line)")
    header_line, header = first
    _check_header(path, header_line, header)
    return CsvRows(path, header_line, header, records)


def read_csv(path: str | Path) -> CsvTable:
    """The header and rows of the CSV file ``path`` (see the module for the rules)."""
    rows = scan_csv(path)
    return CsvTable(rows.path, rows.header_line, rows.header, list(rows))
