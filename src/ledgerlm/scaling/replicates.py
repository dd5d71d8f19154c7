"""Rows that share (N, D): replicates, learning-rate tuning and duplicates.

A sweep that tries several learning rates (or seeds) per (N, D) gives several losses
for one point of the law. Fitting them all as independent evidence overweights the
tuned points and, in a point bootstrap, shrinks the intervals with every copy. So rows
are grouped by (N, D) and either

- ``best``: the lowest loss of the group is kept (a tuned sweep: the law describes
  the best run a size and budget can give), the default when the rows carry a
  learning rate;
- ``mean``: the group's mean loss (seeds of one recipe);
- ``none``: every row is kept; the bootstrap then resamples whole (N, D) groups
  (``ScalingLaw.bootstrap``), so copies never count as more evidence.

Exact duplicate rows (equal N, D and loss) are counted and warned about whatever the
reduction: they are usually a table joined twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REDUCTIONS = ("best", "mean", "none")


def group_ids(N, D) -> np.ndarray:
    """One integer per row, equal for rows with the same (N, D), numbered in first-seen
    order (from one sort of the rows: a few arrays of the rows' length)."""
    N = np.asarray(N, dtype=np.float64).ravel()
    D = np.asarray(D, dtype=np.float64).ravel()
    order = np.lexsort((D, N))  # stable: each group's rows in file order
    Ns, Ds = N[order], D[order]
    starts = np.ones(N.size, dtype=bool)  # where a group begins in sorted order
    starts[1:] = (Ns[1:] != Ns[:-1]) | (Ds[1:] != Ds[:-1])
    ids = np.empty(N.size, dtype=np.int64)
    ids[order] = np.cumsum(starts) - 1  # groups numbered in sorted order
    renumber = np.empty(int(starts.sum()), dtype=np.int64)
    renumber[np.argsort(order[starts], kind="stable")] = np.arange(renumber.size)
    return renumber[ids]


@dataclass(frozen=True)
class Reduced:
    """The rows after reduction, and what was done to them."""

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    kept: np.ndarray  # for best and none: the input row of each output row; mean: the first
    how: str
    rows_in: int
    groups: int  # distinct (N, D)
    replicated: int  # groups with more than one row
    duplicates: int  # rows that repeat an earlier row exactly (N, D and loss)

    def note(self) -> str:
        """What was reduced, in one line."""
        head = f"{self.rows_in} rows, {self.groups} distinct (N, D)"
        if self.how == "none" or not self.replicated:
            extra = (
                f"; {self.replicated} with several rows, kept all (the bootstrap resamples "
                "(N, D) groups)"
                if self.replicated
                else ""
            )
            return head + extra
        rule = "the lowest loss" if self.how == "best" else "the mean loss"
        return f"{head}; {self.replicated} with several rows reduced to {rule} ({self.how})"

    def warnings(self) -> list[str]:
        if not self.duplicates:
            return []
        return [
            f"{self.duplicates} row(s) repeat an earlier row exactly (same N, D and loss): "
            "a table joined twice? They are not counted as more evidence"
        ]

    def to_dict(self) -> dict:
        return {
            "how": self.how,
            "rows_in": self.rows_in,
            "groups": self.groups,
            "replicated": self.replicated,
            "duplicates": self.duplicates,
            "note": self.note(),
        }


def default_reduction(has_lr: bool) -> str:
    """``best`` when rows carry a learning rate (a tuning sweep), else ``none``."""
    return "best" if has_lr else "none"


def reduce_replicates(N, D, loss, how: str = "none") -> Reduced:
    """Rows grouped by (N, D) and reduced by ``how`` (``best``, ``mean`` or ``none``).

    Output rows keep the order in which each (N, D) first appears (``none``: input
    order)."""
    if how not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {how!r}")
    N = np.asarray(N, dtype=np.float64)
    D = np.asarray(D, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    gid = group_ids(N, D)
    n_groups = int(gid.max()) + 1 if gid.size else 0
    sizes = np.bincount(gid, minlength=n_groups)
    triples = np.stack([N, D, loss], axis=1)
    duplicates = len(triples) - len(np.unique(triples, axis=0)) if len(triples) else 0
    if how == "none":
        kept = np.arange(len(N))
        out = (N, D, loss)
    else:  # one sort: each group's rows together, by loss for best, in file order within
        order = np.lexsort((loss, gid)) if how == "best" else np.argsort(gid, kind="stable")
        first = np.ones(len(N), dtype=bool)
        first[1:] = gid[order][1:] != gid[order][:-1]
        kept = order[first]  # best: the lowest loss, the first row of a tie; mean: the first
        if how == "best":
            reduced = loss[kept]
        else:
            reduced = np.bincount(gid, weights=loss, minlength=n_groups) / sizes
        out = (N[kept], D[kept], reduced)
    return Reduced(
        *out,
        kept=kept,
        how=how,
        rows_in=len(N),
        groups=n_groups,
        replicated=int((sizes > 1).sum()),
        duplicates=int(duplicates),
    )
