"""Choosing LSH bands and rows: the S-curve of candidate probability and the (bands, rows)
split of a permutation budget that minimizes the weighted false positive and negative areas."""

from __future__ import annotations

import numpy as np


def s_curve(s: float | np.ndarray, bands: int, rows: int) -> np.ndarray:
    """P(two documents of Jaccard ``s`` share a band) = 1 - (1 - s^r)^b.

    Written as ``-expm1(b * log1p(-s^r))`` so that tiny probabilities keep their precision
    where the direct form would round to 0.
    """
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return -np.expm1(bands * np.log1p(-(s**rows)))


def _simpson(y: np.ndarray, a: float, b: float) -> np.ndarray:
    """Composite Simpson's rule along the last axis (an odd number of equally spaced points)."""
    n = y.shape[-1] - 1
    if n < 2 or n % 2:
        raise ValueError("Simpson's rule needs an even number of intervals")
    w = np.ones(n + 1)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return (y @ w) * (b - a) / (3.0 * n)


def fp_fn_integrals(
    threshold: float, bands: np.ndarray | int, rows: np.ndarray | int, intervals: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """Areas of false positives (below the threshold) and false negatives (above it).

    FP = integral over [0, t] of P(candidate | s); FN = integral over [t, 1] of
    1 - P(candidate | s). Each side has its own grid, so the kink at ``t`` is a grid point.
    """
    b = np.atleast_1d(np.asarray(bands, dtype=np.float64))[:, None]
    r = np.atleast_1d(np.asarray(rows, dtype=np.float64))[:, None]
    lo = np.linspace(0.0, threshold, intervals + 1)[None, :]
    hi = np.linspace(threshold, 1.0, intervals + 1)[None, :]
    with np.errstate(divide="ignore"):
        p_lo = -np.expm1(b * np.log1p(-(lo**r)))
        p_hi = -np.expm1(b * np.log1p(-(hi**r)))
    return _simpson(p_lo, 0.0, threshold), _simpson(1.0 - p_hi, threshold, 1.0)


def optimal_bands_rows(threshold: float, num_perm: int, fp_weight: float = 0.5) -> tuple[int, int]:
    """The (bands, rows) with bands*rows <= num_perm minimizing the weighted FP + FN areas.

    A heavier ``fp_weight`` buys precision (fewer pairs to verify) with recall. Ties go to
    the first candidate in (bands, rows) order, so the answer is deterministic.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1): {threshold}")
    if num_perm < 1:
        raise ValueError(f"num_perm must be >= 1: {num_perm}")
    if not 0.0 <= fp_weight <= 1.0:
        raise ValueError(f"fp_weight must be in [0, 1]: {fp_weight}")
    cand_b: list[int] = []
    cand_r: list[int] = []
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            cand_b.append(b)
            cand_r.append(r)
    bs = np.asarray(cand_b)
    rs = np.asarray(cand_r)
    errors = np.empty(len(bs))
    step = 4096  # bounds the (candidates x grid) matrix for large num_perm
    for i in range(0, len(bs), step):
        fp, fn = fp_fn_integrals(threshold, bs[i : i + step], rs[i : i + step])
        errors[i : i + step] = fp_weight * fp + (1.0 - fp_weight) * fn
    best = int(np.argmin(errors))
    return int(bs[best]), int(rs[best])
