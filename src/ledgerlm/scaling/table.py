"""Scaling points from a CSV table: which columns hold N, D (or C) and the loss.

Columns are found by name: N as ``N``, ``params``, ``parameters`` or ``Model Size``;
D as ``D``, ``tokens`` or ``Training Tokens``; compute as ``C``, ``flops`` or
``Training FLOP`` (then D = C / (6 N)); the loss as ``loss``, ``val_loss`` or
``final_loss``; an optional learning rate as ``lr`` or ``learning_rate``. Any of them
can be named instead (``n_col=`` ...), so Epoch AI's reconstruction of the Chinchilla
runs (``Model Size``, ``Training FLOP``, ``loss``) reads as it is. A value that is
not a positive finite number is refused with the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ledgerlm.scaling.law import KAPPA

KNOWN = {
    "N": ("N", "n", "params", "parameters", "Model Size", "model_size"),
    "D": ("D", "tokens", "Training Tokens", "training_tokens"),
    "C": ("C", "flops", "FLOPs", "Training FLOP", "training_flop", "compute"),
    "loss": ("loss", "Loss", "val_loss", "final_loss"),
    "lr": ("lr", "learning_rate", "LR"),
}


@dataclass(frozen=True)
class TablePoints:
    """(N, D, loss) rows of a CSV file, with their learning rates when it has them."""

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    lr: np.ndarray | None
    lines: np.ndarray  # the file line of each row (the header is line 1)
    columns: dict[str, str]  # what each quantity was read from ("D": "C / (6 N)" ...)

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def select(self, keep: np.ndarray) -> TablePoints:
        lr = None if self.lr is None else self.lr[keep]
        return TablePoints(
            self.N[keep], self.D[keep], self.loss[keep], lr, self.lines[keep], self.columns
        )


def _column(fields: list[str], quantity: str, given: str | None, path: Path) -> str | None:
    if given is not None:
        if given not in fields:
            raise ValueError(
                f"{path}: no column {given!r} for {quantity} (columns: {', '.join(fields)})"
            )
        return given
    return next((name for name in KNOWN[quantity] if name in fields), None)


def _number(value: str | None, path: Path, line: int, column: str) -> float:
    try:
        x = float(value) if value is not None else math.nan
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{path}:{line}: column {column!r}: {value!r} is not a positive number")
    return x


def read_points(
    path: str | Path,
    *,
    n_col: str | None = None,
    d_col: str | None = None,
    c_col: str | None = None,
    loss_col: str | None = None,
    lr_col: str | None = None,
    kappa: float = KAPPA,
) -> TablePoints:
    """The rows of ``path`` as points; see the module for the columns looked for."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or ())
        n = _column(fields, "N", n_col, path)
        loss = _column(fields, "loss", loss_col, path)
        d = _column(fields, "D", d_col, path) if c_col is None else None
        c = _column(fields, "C", c_col, path) if d is None else None
        lr = _column(fields, "lr", lr_col, path)
        missing = [
            f"{q} ({' or '.join(KNOWN[q])}; or name it with --{q.lower()}-col)"
            for q, col in (("N", n), ("loss", loss))
            if col is None
        ]
        if d is None and c is None:
            missing.append("D or C (tokens or compute; --d-col or --c-col)")
        if missing:
            raise ValueError(f"{path}: missing column(s) for {'; '.join(missing)}")
        rows, lines = [], []
        for line, row in enumerate(reader, start=2):
            values = [_number(row.get(col), path, line, col) for col in (n, d or c, loss)]
            if lr is not None:
                values.append(_number(row.get(lr), path, line, lr))
            rows.append(values)
            lines.append(line)
    if not rows:
        raise ValueError(f"{path}: no rows")
    arr = np.array(rows, dtype=np.float64)
    N, second, losses = arr[:, 0], arr[:, 1], arr[:, 2]
    D = second if d is not None else second / (kappa * N)
    columns = {"N": n, "D": d if d is not None else f"{c} / ({kappa:g} N)", "loss": loss}
    if lr is not None:
        columns["lr"] = lr
    return TablePoints(
        N, D, losses, arr[:, 3] if lr is not None else None, np.array(lines), columns
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
