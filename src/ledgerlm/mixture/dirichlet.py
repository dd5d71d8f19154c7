"""Dirichlet draws of mixtures around a center, and the concentration of a set of rows.

``dirichlet_around`` draws mixtures (rows summing to 1) whose mean is a center and whose
spread the concentration sets; ``concentration_of`` estimates the concentration of
given rows (the method of moments). A search draws its proxy trials so, and
``recommend`` its candidates.
"""

from __future__ import annotations

import math

import numpy as np

#: ``concentration_of`` falls back to this many times the number of domains when the
#: rows do not determine the concentration (one row, identical rows): Dirichlet(1, ..., 1)
#: around a uniform center, the uniform distribution on the simplex.
FALLBACK_CONCENTRATION_PER_DOMAIN = 1.0
#: Bounds of an estimated concentration: rows spread wider than any Dirichlet allows give
#: the lower one, rows that barely vary the upper one.
CONCENTRATION_RANGE = (1e-2, 1e6)


def as_center(center: np.ndarray) -> np.ndarray:
    """A mixture center (one row of weights >= 0 with a positive sum), normalised."""
    c = np.asarray(center, dtype=np.float64)
    if c.ndim != 1 or c.size < 1:
        raise ValueError(f"a mixture center must be one row of weights, got shape {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0) or c.sum() <= 0:
        raise ValueError("a mixture center needs finite weights >= 0 with a positive sum")
    return c / c.sum()


def check_concentration(concentration: float) -> None:
    if not (math.isfinite(concentration) and concentration > 0):
        raise ValueError(f"the concentration must be a positive number, got {concentration!r}")


def draw(rng: np.random.Generator, center: np.ndarray, concentration: float, n: int):
    """``n`` rows from Dirichlet(concentration x center) on the positive domains of a
    normalised ``center`` (``as_center``)."""
    out = np.zeros((n, center.size))
    live = np.flatnonzero(center > 0)
    if live.size == 1:
        out[:, live[0]] = 1.0
        return out
    draws = rng.dirichlet(concentration * center[live], size=n)
    total = draws.sum(axis=1)
    bad = ~(np.all(np.isfinite(draws), axis=1) & (total > 0))
    if bad.any():  # guards extreme parameters: such a row falls back to the center
        draws[bad], total[bad] = center[live], 1.0
    out[:, live] = draws / total[:, None]
    return out


def dirichlet_around(center: np.ndarray, concentration: float, n: int, seed: int) -> np.ndarray:
    """``n`` mixtures (n, k) from Dirichlet(concentration x center), the same for a seed.

    The center is normalised to sum to 1; its mean is the center and the larger the
    concentration, the closer the rows stay to it (Var w_i = c_i (1 - c_i) / (s + 1)).
    Domains whose center weight is 0 stay 0 in every row."""
    c = as_center(center)
    check_concentration(concentration)
    if n < 0:
        raise ValueError(f"cannot draw {n} mixtures")
    return draw(np.random.default_rng(seed), c, float(concentration), int(n))


def concentration_of(weights: np.ndarray) -> float:
    """The Dirichlet precision s of the rows, by the method of moments.

    Each domain with a variance gives s_i = m_i (1 - m_i) / Var w_i - 1 (m the mean, the
    variance unbiased); the estimate is their median, so one odd domain does not move it,
    clipped to ``CONCENTRATION_RANGE``. With fewer than two rows or no varying domain it
    is ``FALLBACK_CONCENTRATION_PER_DOMAIN`` x k."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] < 1:
        raise ValueError(f"weights must be a 2-D array (rows x domains), got shape {w.shape}")
    fallback = FALLBACK_CONCENTRATION_PER_DOMAIN * w.shape[1]
    if w.shape[0] < 2:
        return fallback
    m = w.mean(axis=0)
    v = w.var(axis=0, ddof=1)
    ok = (v > 1e-300) & (m > 0) & (m < 1)
    if not ok.any():
        return fallback
    s = m[ok] * (1 - m[ok]) / v[ok] - 1
    lo, hi = CONCENTRATION_RANGE
    return float(np.clip(np.median(s), lo, hi))
