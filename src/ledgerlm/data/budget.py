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


def representative_weights(cluster_sizes: Sequence[int] | np.ndarray, mode: str) -> np.ndarray:
    """Weight of each kept representative as a data version stores it: its cluster's size
    (``preserve``) or 1 (``rebalance``)."""
    sizes = np.asarray(cluster_sizes, dtype=np.float64)
    if np.any(sizes < 1):
        raise ValueError("cluster sizes are at least 1")
    if mode == "preserve":
        return sizes
    if mode == "rebalance":
        return np.ones_like(sizes)
    raise ValueError(f"unknown weights mode {mode!r} (one of {', '.join(WEIGHT_MODES)})")


def dedup_weights(cluster_sizes: Sequence[int] | np.ndarray, mode: str) -> np.ndarray:
    """Sampling weight of each kept representative, normalized to sum to 1."""
    if len(cluster_sizes) == 0:
        return np.asarray(cluster_sizes, dtype=np.float64)
    raw = representative_weights(cluster_sizes, mode)
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


def budget(lengths: Sequence[int] | np.ndarray, kept: Sequence[bool] | np.ndarray) -> Budget:
    """Budget of documents of given lengths, ``kept`` marking the one representative of
    each duplicate cluster (the unique content); the others are its repeats."""
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = np.asarray(kept, dtype=bool)
    if lengths.shape != keep.shape:
        raise ValueError("one kept flag per document")
    if np.any(lengths < 0):
        raise ValueError("lengths are at least 0")
    raw, unique = int(lengths.sum()), int(lengths[keep].sum())
    return Budget(raw, unique, raw - unique, raw / unique if unique else 0.0)
