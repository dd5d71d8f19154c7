"""Scaling points from a CSV table: which columns hold N, D (or C) and the loss.

Columns are found by name: N as ``N``, ``params``, ``parameters`` or ``Model Size``;
D as ``D``, ``tokens`` or ``Training Tokens``; compute as ``C``, ``flops`` or
``Training FLOP`` (then D = C / (6 N)); the loss as ``loss``, ``val_loss`` or
``final_loss``; an optional learning rate as ``lr`` or ``learning_rate``. Any of them
can be named instead (``n_col=`` ...), so Epoch AI's reconstruction of the Chinchilla
runs (``Model Size``, ``Training FLOP``, ``loss``) reads as it is. The header follows
``ledgerlm.tables`` (a byte-order mark and spaces around names are accepted, a name
given twice is refused); a value that is not a positive finite number is refused with
the file, the line and the column, and so is a loss above ``MAX_LOSS`` nat/token. The
rows are read one at a time into arrays of numbers (``ledgerlm.tables.scan_csv``), so a
table of a million rows takes its numbers' memory, not its text's.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ledgerlm.errors import ArgumentError
from ledgerlm.scaling.law import KAPPA
from ledgerlm.tables import scan_csv

KNOWN = {
    "N": ("N", "n", "params", "parameters", "Model Size", "model_size"),
    "D": ("D", "tokens", "Training Tokens", "training_tokens"),
    "C": ("C", "flops", "FLOPs", "Training FLOP", "training_flop", "compute"),
    "loss": ("loss", "Loss", "val_loss", "final_loss"),
    "lr": ("lr", "learning_rate", "LR"),
}

# No language model's loss is above this many nat/token (the uniform guess over a
# vocabulary of a million tokens is 13.8): a larger one is a diverged run or another
# unit (a loss per sequence, a perplexity), and one such row decides the fit.
MAX_LOSS = 100.0


@dataclass(frozen=True)
class TablePoints:
    """(N, D, loss) rows of a CSV file, with their learning rates when it has them."""

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    lr: np.ndarray | None
    lines: np.ndarray  # the file line of each row (the header is line 1)
    columns: dict[str, str]  # what each quantity was read from ("D": "C / (6 N)" ...)
    budget: np.ndarray | None = None  # each row's isoFLOP budget label, when asked for

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def select(self, keep: np.ndarray) -> TablePoints:
        pick = lambda a: None if a is None else a[keep]  # noqa: E731
        return TablePoints(
            self.N[keep],
            self.D[keep],
            self.loss[keep],
            pick(self.lr),
            self.lines[keep],
            self.columns,
            pick(self.budget),
        )


def _column(fields: list[str], quantity: str, given: str | None, where: str) -> str | None:
    if given is not None:
        if given not in fields:
            raise ValueError(
                f"{where}: no column {given!r} for {quantity} (columns: {', '.join(fields)})"
            )
        return given
    return next((name for name in KNOWN[quantity] if name in fields), None)


def _number(value: str, path: Path, line: int, column: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{path}:{line}: column {column!r}: {value!r} is not a positive number")
    return x


def _loss(value: str, path: Path, line: int, column: str) -> float:
    x = _number(value, path, line, column)
    if x > MAX_LOSS:
        raise ValueError(
            f"{path}:{line}: column {column!r}: {value!r} is not a loss in nat/token (above "
            f"{MAX_LOSS:g}): a diverged run, or another unit?"
        )
    return x


def read_points(
    path: str | Path,
    *,
    n_col: str | None = None,
    d_col: str | None = None,
    c_col: str | None = None,
    loss_col: str | None = None,
    lr_col: str | None = None,
    budget_col: str | None = None,
    kappa: float = KAPPA,
) -> TablePoints:
    """The rows of ``path`` as points; see the module for the columns looked for.

    The file is read by ``ledgerlm.tables.scan_csv`` (its header rules: a byte-order
    mark, spaces around names, duplicated names). ``budget_col`` names a column of
    isoFLOP budget labels (numbers, e.g. 6e18), returned as ``budget``. A quantity
    whose column is neither found nor named is an ``ArgumentError`` naming the argument
    that would name it (``n_col`` ...)."""
    table = scan_csv(path)
    path, fields = table.path, table.header
    where = f"{path}:{table.header_line}"
    n = _column(fields, "N", n_col, where)
    loss = _column(fields, "loss", loss_col, where)
    d = _column(fields, "D", d_col, where) if c_col is None else None
    c = _column(fields, "C", c_col, where) if d is None else None
    lr = _column(fields, "lr", lr_col, where)
    if budget_col is not None and budget_col not in fields:
        raise ValueError(f"{where}: no column {budget_col!r} for the isoFLOP budget")
    missing = [  # the names looked for are values, the arguments fields: {n_col}
        f"{q} ({{known_{q}}}; or name it with {{{q.lower()}_col}})"
        for q, col in (("N", n), ("loss", loss))
        if col is None
    ]
    if d is None and c is None:
        missing.append("D or C (tokens or compute; {d_col} or {c_col})")
    if missing:
        known = {f"known_{q}": " or ".join(KNOWN[q]) for q in ("N", "loss")}
        raise ArgumentError(
            "{where}: missing column(s) for " + "; ".join(missing), where=where, **known
        )
    wanted = [n, d or c, loss, *(x for x in (lr, budget_col) if x is not None)]
    read = [(table.column(col), col, _loss if col == loss else _number) for col in wanted]
    values = [array("d") for _ in wanted]
    lines = array("q")
    for line, cells in table:
        lines.append(line)
        for (i, col, number), out in zip(read, values, strict=True):
            out.append(number(cells[i], path, line, col))
    arr = [np.array(v, dtype=np.float64) for v in values]
    N, second, losses = arr[0], arr[1], arr[2]
    D = second if d is not None else second / (kappa * N)
    columns = {"N": n, "D": d if d is not None else f"{c} / ({kappa:g} N)", "loss": loss}
    if lr is not None:
        columns["lr"] = lr
    return TablePoints(
        N,
        D,
        losses,
        arr[3] if lr is not None else None,
        np.array(lines, dtype=np.int64),
        columns,
        arr[-1] if budget_col is not None else None,
    )


def drop_top_loss(points: TablePoints, k: int) -> TablePoints:
    """The table without its ``k`` highest-loss rows (file order kept)."""
    if k <= 0:
        return points
    keep = np.ones(len(points.N), dtype=bool)
    keep[np.argsort(-points.loss, kind="stable")[:k]] = False
    return points.select(keep)


def load_epoch_chinchilla(path, drop_highest_loss: int = 0) -> TablePoints:
    """Epoch AI's reconstruction of Hoffmann et al.'s runs (Besiroglu et al. 2024):
    columns ``Model Size`` (N), ``Training FLOP`` (C) and ``loss``, D = C / (6 N).
    ``drop_highest_loss`` removes that many highest-loss rows (the replication drops 5
    outliers)."""
    points = read_points(path, n_col="Model Size", c_col="Training FLOP", loss_col="loss")
    return drop_top_loss(points, drop_highest_loss)
