"""The recommended mixture (RegMix, Liu et al. 2024) and when it is weak evidence.

``recommend`` draws many candidate mixtures from a Dirichlet around a center, predicts
each, and averages the ``top_k`` best. A recommendation from few runs, or from a
regression whose cross-validated ranking is poor, is weak evidence: ``weak_fit`` (a
table of runs) and ``weak_search`` (a search's trials) say so with the same bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from ledgerlm.mixture.dirichlet import as_center, check_concentration, draw
from ledgerlm.mixture.regress import DEFAULT_SEED

#: Candidates ``recommend`` draws, the best it averages, and how many it scores at once
#: (memory: ``RECOMMEND_CHUNK`` x domains float64s, 2.2 MB for 17 domains).
DEFAULT_CANDIDATES = 100_000
DEFAULT_TOP_K = 100
RECOMMEND_CHUNK = 16_384

#: Below these the recommendation is weak evidence: fewer runs (rows, trials) than
#: ``WEAK_ROWS`` or a cross-validated Spearman below ``WEAK_SPEARMAN``.
WEAK_SPEARMAN = 0.5
WEAK_ROWS = 16


def recommend(
    predict: Callable[[np.ndarray], np.ndarray],
    center: np.ndarray,
    concentration: float,
    *,
    candidates: int = DEFAULT_CANDIDATES,
    top_k: int = DEFAULT_TOP_K,
    seed: int = DEFAULT_SEED,
) -> np.ndarray:
    """RegMix's recipe: the mean of the ``top_k`` lowest-predicted of ``candidates``
    mixtures drawn from Dirichlet(concentration x center); a mixture (sums to 1).

    ``predict`` maps an (m, k) array to (m,) values to minimise. Candidates are drawn
    and scored ``RECOMMEND_CHUNK`` at a time, keeping only the best ``top_k``."""
    c = as_center(center)
    check_concentration(concentration)
    if candidates < 1 or top_k < 1:
        raise ValueError("recommend needs at least one candidate and top_k >= 1")
    keep = min(int(top_k), int(candidates))
    rng = np.random.default_rng(seed)
    best_w = np.empty((0, c.size))
    best_y = np.empty(0)
    left = int(candidates)
    while left > 0:
        m = min(left, RECOMMEND_CHUNK)
        left -= m
        w = draw(rng, c, float(concentration), m)
        y = np.asarray(predict(w), dtype=np.float64).reshape(-1)
        if y.shape != (m,):
            raise ValueError(f"predict returned {y.shape[0]} values for {m} mixtures")
        y = np.where(np.isnan(y), np.inf, y)  # a NaN prediction is never the best
        best_w = np.concatenate([best_w, w])
        best_y = np.concatenate([best_y, y])
        if len(best_y) > keep:
            order = np.argsort(best_y, kind="stable")[:keep]
            best_w, best_y = best_w[order], best_y[order]
    mix = best_w.mean(axis=0)
    return mix / mix.sum()


def weak_fit(rows: int, spearman: float) -> str | None:
    """Why a recommendation from a table of ``rows`` runs whose regression ranks them
    with ``spearman`` (cross-validated; NaN: undefined) is weak evidence, in one line;
    None when it is not."""
    reasons = []
    if not math.isfinite(spearman):
        reasons.append("the cross-validated Spearman is undefined (constant predictions)")
    elif spearman < WEAK_SPEARMAN:
        reasons.append(f"the cross-validated Spearman is {spearman:.2f} (< {WEAK_SPEARMAN:g})")
    if rows < WEAK_ROWS:
        reasons.append(f"only {rows} rows (< {WEAK_ROWS})")
    if not reasons:
        return None
    return " and ".join(reasons) + ": the recommended mixture is weak evidence"


def weak_search(trials: int, spearmans: Mapping[str, float | None]) -> list[str] | None:
    """Whether a search's recommendation from ``trials`` trials is weak evidence: None
    when it is not, else the targets whose regression's cross-validated Spearman
    (``spearmans``, None: undefined) is below ``WEAK_SPEARMAN`` (none: too few trials)."""
    weak = [name for name, s in spearmans.items() if not (s or 0) >= WEAK_SPEARMAN]
    return weak if trials < WEAK_ROWS or weak else None
