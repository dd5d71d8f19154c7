"""What deduplication does to the training target and to the token budget (D5, D6).

Dropping duplicates changes the distribution a model is trained on. Keeping the
representative with weight = cluster size preserves the original distribution;
weight 1 rebalances it toward unique content. Neither is free, so the choice is
explicit and reported. Budgets count raw tokens (with repeats) apart from unique
ones, so "we trained on N tokens" says how many of them were new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

WEIGHT_MODES = ("rebalance", "preserve")


def dedup_weights(cluster_sizes: Sequence[int] | np.ndarray, mode: str) -> np.ndarray:
    """Sampling weight of each kept representative, normalized to sum to 1."""
    sizes = np.asarray(cluster_sizes, dtype=np.float64)
    if sizes.size == 0:
        return sizes
    if np.any(sizes < 1):
        raise ValueError("cluster sizes are at least 1")
    if mode == "preserve":
        raw = sizes
    elif mode == "rebalance":
        raw = np.ones_like(sizes)
    else:
        raise ValueError(f"unknown weights mode {mode!r} (one of {', '.join(WEIGHT_MODES)})")
    return raw / raw.sum()


def weighted_mean(values: Sequence[float] | np.ndarray, weights=None) -> float:
    """The squared-error optimum of a constant predictor under these sampling weights."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    return float((v * w).sum() / w.sum())


@dataclass(frozen=True)
class Budget:
    """Raw = every copy counted; unique = each duplicate cluster counted once."""

    raw: int
    unique: int
    repeats: int  # raw - unique
    exposure: float  # raw / unique: how many times a unique unit is seen on average

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def budget(unit_lengths: Sequence[int] | np.ndarray, copies: Sequence[int] | np.ndarray) -> Budget:
    """Budget of unique units (documents) of given lengths, each present ``copies`` times."""
    lengths = np.asarray(unit_lengths, dtype=np.int64)
    n = np.asarray(copies, dtype=np.int64)
    if lengths.shape != n.shape:
        raise ValueError("one copy count per unit")
    if np.any(n < 1):
        raise ValueError("every unit is present at least once")
    raw, unique = int((lengths * n).sum()), int(lengths.sum())
    return Budget(raw, unique, raw - unique, raw / unique if unique else 0.0)
