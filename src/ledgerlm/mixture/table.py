"""A table of proxy runs read from a CSV file: the domain weights of each run (a mixture)
and, for a regression, its result.

``read_mixture_table`` reads such a table with the shared CSV rules (``ledgerlm.tables``)
and one-line errors naming the file and the line; weights rounded for print (a
published table's 3 decimals) are renormalized when their rounding explains their sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import numpy as np

from ledgerlm.errors import ArgumentError
from ledgerlm.mixture.regress import MIN_ROWS
from ledgerlm.tables import read_csv

#: A row's weights must sum to 1 within this before it is renormalised to exactly 1, or
#: within the rounding of their printed decimals (``rounding_tolerance``: published
#: tables print weights to 3 decimals, and 17 of them may sum to 0.996 or 1.003).
SUM_TOLERANCE = 1e-3


@dataclass
class MixtureTable:
    """Mixtures read from a CSV file: weights (n, k) over ``domains``, rows summing to 1."""

    domains: list[str]
    weights: np.ndarray
    target: np.ndarray | None
    target_name: str | None
    names: list[str] | None  # the one non-numeric label column's values, if exactly one
    warnings: list[str] = field(default_factory=list)  # rows renormalized from their rounding


def _number(text: str) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _is_numeric_column(cells: list[str]) -> bool:
    """A column of numbers: at least half of its non-empty cells parse as numbers (so a
    typo in a weight column is reported, not taken for a column of run names)."""
    filled = [c for c in cells if c]
    if not filled:
        return False
    return 2 * sum(_number(c) is not None for c in filled) >= len(filled)


def printed_decimals(text: str) -> int:
    """The decimals a number is printed with, read from its text: ``0.334`` 3, ``0.50``
    2, ``1`` 0, ``2.5e-4`` 5 (the exponent shifts them)."""
    exponent = Decimal(text).as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def rounding_tolerance(weights: int, decimals: int) -> Decimal:
    """How far from 1 a row of ``weights`` may sum when the true weights summed to 1 and
    each was rounded to ``decimals`` (the row's finest printed decimal): the number of
    weights x half a unit of that decimal (0.0085 for 17 weights at 3 decimals). Zero
    without decimals (weights printed as 0 and 1 are exact, not rounded)."""
    if decimals == 0:
        return Decimal(0)
    return weights * Decimal(5).scaleb(-(decimals + 1))


def _renormalized_warning(path: Path, rows: int, rounded: list[tuple[int, Decimal]]) -> str:
    """One line counting the rows accepted only within their rounding."""
    decimals = sorted({d for d, _ in rounded})
    places = f"{decimals[0]}" if len(decimals) == 1 else f"{decimals[0]}- to {decimals[-1]}"
    sums = [float(total) for _, total in rounded]
    return (
        f"{path}: renormalized {len(rounded)} of {rows} rows whose weights sum to 1 only "
        f"within their {places}-decimal rounding (sums {min(sums):.6g} to {max(sums):.6g})"
    )


def _column_list(names: Sequence[str]) -> str:
    return ", ".join(names) if len(names) <= 20 else ", ".join(names[:20]) + ", ..."


def read_mixture_table(
    path: Path,
    target: str | None,
    ignore: Sequence[str] = (),
    domains: Sequence[str] | None = None,
) -> MixtureTable:
    """Read mixtures (and a target column) from a CSV file with a header.

    Without ``domains``: every numeric column other than ``target`` and ``ignore`` is a
    domain weight; non-numeric columns (run names) are labels. With ``domains``: exactly
    those columns, in that order, are the weights (others are ignored). Every row's
    weights must be finite, >= 0 and sum to 1 within ``SUM_TOLERANCE`` or within the
    rounding of their printed decimals (``rounding_tolerance``: the rows accepted so are
    counted in ``warnings``); they are then renormalised to sum exactly to 1. A table
    with a target is a regression's: it needs ``MIN_ROWS`` rows. Errors are one-line
    ``ValueError``s naming the file and line (the header is line 1); a ``target`` or
    ``ignore`` column the header lacks is an ``ArgumentError`` naming that argument."""
    path = Path(path)
    csv = read_csv(path)
    header_line, header, rows = csv.header_line, csv.header, csv.rows
    where = f"{path}:{header_line}"
    for name in [*([target] if target is not None else []), *ignore]:
        if name not in header:
            what = "{target}" if name == target else "{ignore}"
            raise ArgumentError(
                "{where}: " + what + " column {name!r} is not in the header (columns: {columns})",
                where=where,
                name=name,
                columns=_column_list(header),
            )
    if target is not None and target in ignore:
        raise ValueError(f"{where}: column {target!r} is both the target and ignored")
    columns = {name: [cells[i] for _, cells in rows] for i, name in enumerate(header)}
    numeric = {name: _is_numeric_column(cells) for name, cells in columns.items()}
    skip = {*ignore, *([target] if target is not None else [])}
    if domains is not None:
        domain_list = list(domains)
        missing = [d for d in domain_list if d not in header]
        if missing:
            raise ValueError(
                f"{where}: no column for domain {missing[0]!r}"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                + f"; the weights need the columns {_column_list(domain_list)}"
            )
    else:
        domain_list = [h for h in header if h not in skip and numeric[h]]
    if len(domain_list) < 2:
        found = f" ({', '.join(domain_list)})" if domain_list else ""
        plural = "" if len(domain_list) == 1 else "s"
        raise ValueError(
            f"{where}: {len(domain_list)} domain weight column{plural}{found}; a mixture "
            "needs at least 2 numeric weight columns"
        )
    labels = [h for h in header if h not in skip and h not in domain_list and not numeric[h]]
    names = list(columns[labels[0]]) if len(labels) == 1 else None

    index = {name: i for i, name in enumerate(header)}
    di = [index[d] for d in domain_list]
    ti = index[target] if target is not None else None
    weights = np.empty((len(rows), len(di)))
    values = np.empty(len(rows)) if ti is not None else None
    rounded: list[tuple[int, Decimal]] = []  # (decimals, sum) of rows off by their rounding
    for r, (line, cells) in enumerate(rows):
        for j, (d, i) in enumerate(zip(domain_list, di, strict=True)):
            cell = cells[i]
            x = _number(cell)
            if x is None:
                why = "no weight" if not cell else f"weight {cell!r} is not a number"
                raise ValueError(f"{path}:{line}: {why} for domain {d!r}")
            if not math.isfinite(x):
                raise ValueError(f"{path}:{line}: weight {cell!r} of domain {d!r} is not finite")
            if x < 0:
                raise ValueError(f"{path}:{line}: weight {cell} of domain {d!r} is negative")
            weights[r, j] = x
        printed = [cells[i] for i in di]
        total = sum(map(Decimal, printed))  # exact: the sum of the numbers as printed
        off = abs(total - 1)
        if off > Decimal(repr(SUM_TOLERANCE)):
            places = max(map(printed_decimals, printed))
            rounding = rounding_tolerance(len(printed), places)
            if off >= rounding:  # rounding cannot explain it (a tie at every weight aside)
                within = f"{SUM_TOLERANCE:g}"
                if rounding > SUM_TOLERANCE:
                    within = f"{float(rounding):g} for {len(di)} weights at {places} decimal"
                    within += "s" if places > 1 else ""
                raise ValueError(
                    f"{path}:{line}: the weights sum to {float(total):.6g}, not 1 (tolerance "
                    f"{within}; weight columns: {_column_list(domain_list)})"
                )
            rounded.append((places, total))
        if ti is not None:
            assert values is not None
            cell = cells[ti]
            y = _number(cell)
            if y is None:
                why = "missing" if not cell else f"{cell!r} is not a number"
                raise ValueError(f"{path}:{line}: target {target!r}: {why}")
            if not math.isfinite(y):
                raise ValueError(f"{path}:{line}: target {target!r}: {cell!r} is not finite")
            values[r] = y
    if target is not None and len(rows) < MIN_ROWS:
        raise ValueError(
            f"{path}: {len(rows)} row{'s' if len(rows) > 1 else ''} after the header; a "
            f"mixture regression needs at least {MIN_ROWS} (one per run)"
        )
    weights /= weights.sum(axis=1, keepdims=True)
    return MixtureTable(
        domains=domain_list,
        weights=weights,
        target=values,
        target_name=target,
        names=names,
        warnings=[_renormalized_warning(path, len(rows), rounded)] if rounded else [],
    )
