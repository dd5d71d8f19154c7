"""The mixture regression (RegMix style): from the domain weights of proxy runs to a result.

A table of proxy runs, one row per run, holds the weight of every domain (a mixture: the
row sums to 1) and one or more results (say the validation loss). ``fit_regression``
learns the result from the weights, boosted trees (LightGBM) when there are enough rows
and a ridge regression on the weights for a handful, and measures the quality of the
fit by k-fold cross-validation: Spearman's rank correlation of the out-of-fold
predictions (what a mixture search needs is the ranking), their MAE and RMSE.
Nothing here imports the rest of ledgerlm; LightGBM is imported when first used.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# -- defaults and seeds -----------------------------------------------------------

#: Model choices: "auto" takes LightGBM from ``LIGHTGBM_MIN_ROWS`` rows on, else "linear".
MODELS = ("auto", "lightgbm", "linear")
#: Below this many rows a boosted tree has too little to split on: "auto" fits the ridge.
LIGHTGBM_MIN_ROWS = 32
#: A regression (and its cross-validation) needs at least this many rows.
MIN_ROWS = 3
#: Default number of cross-validation folds (min(folds, rows) are used: leave-one-out
#: when the table has fewer rows than folds).
DEFAULT_FOLDS = 5
#: Default seed of the fold shuffle, LightGBM and the candidate draws.
DEFAULT_SEED = 0

#: LightGBM settings for small tables (tens to a few thousand rows): a few hundred
#: small trees learned slowly (on a smooth 4-domain loss, 15 leaves placed the
#: recommendation about twice as close to the true minimum as 7 did; 200 trees at 0.075
#: match 300 at 0.05 and predict 100,000 candidates a third faster); a leaf needs
#: ``LGB_MIN_CHILD_FRACTION`` of the rows, clipped to ``LGB_MIN_CHILD_RANGE``, so a tree
#: on 40 rows can still split and one on 5,000 rows does not chase noise. Deterministic
#: and row-wise: the same table and seed give the same trees.
LGB_ROUNDS = 200
LGB_LEARNING_RATE = 0.075
LGB_NUM_LEAVES = 15
LGB_MIN_CHILD_FRACTION = 0.05
LGB_MIN_CHILD_RANGE = (2, 20)
#: Training runs on one thread: on a few hundred rows every boosting round is a handful
#: of tiny OpenMP regions, and on a shared 2-core machine a second thread waiting at
#: each region's barrier for a descheduled peer turned a 0.4 s cross-validation into
#: 60 s. Prediction of many rows (the candidates of ``recommend``) is one region per
#: call and gains from ``LGB_PREDICT_THREADS`` from ``LGB_PARALLEL_PREDICT_ROWS`` rows on.
LGB_TRAIN_THREADS = 1
LGB_PREDICT_THREADS = 2
LGB_PARALLEL_PREDICT_ROWS = 4096

#: Ridge penalty of the linear model, relative to the mean diagonal of the centred
#: weights' Gram matrix (so scale-free): small enough that an exactly linear target is fitted to
#: within ~1e-3 of its range, large enough to make the (always collinear: rows sum to 1)
#: system solvable.
RIDGE_LAMBDA = 1e-4

# -- the regression ------------------------------------------------------------------------


@dataclass
class CrossValidation:
    """Out-of-fold quality: each row predicted by a model that never saw it."""

    folds: int
    spearman: float  # NaN when the predictions or the targets are constant
    mae: float
    rmse: float
    predictions: np.ndarray = field(repr=False)  # out-of-fold, in row order

    def to_dict(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "spearman": _finite_or_none(self.spearman),
            "mae": _finite_or_none(self.mae),
            "rmse": _finite_or_none(self.rmse),
        }


@dataclass
class MixtureRegression:
    """A regression from mixture weights to a target, refitted on every row."""

    model: str  # "lightgbm" or "linear"
    domains: list[str]
    cv: CrossValidation
    rows: int = 0
    settings: dict[str, Any] = field(default_factory=dict)
    _predict: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False)

    def predict(self, weights: np.ndarray) -> np.ndarray:
        """The predicted target of each row of ``weights`` (m, k): an (m,) array."""
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim == 1:
            w = w[None, :]
        if w.ndim != 2 or w.shape[1] != len(self.domains):
            raise ValueError(
                f"expected mixtures over {len(self.domains)} domains, got shape {w.shape}"
            )
        if self._predict is None:
            raise ValueError("this regression holds no fitted model")
        return np.asarray(self._predict(w), dtype=np.float64).reshape(-1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (no per-row arrays; NaN as None)."""
        return {
            "model": self.model,
            "domains": list(self.domains),
            "rows": self.rows,
            "settings": dict(self.settings),
            "cv": self.cv.to_dict(),
        }


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _min_child(rows: int) -> int:
    lo, hi = LGB_MIN_CHILD_RANGE
    return int(np.clip(round(LGB_MIN_CHILD_FRACTION * rows), lo, hi))


def _lgb_params(rows: int, seed: int) -> dict[str, Any]:
    return {
        "objective": "regression",
        "learning_rate": LGB_LEARNING_RATE,
        "num_leaves": LGB_NUM_LEAVES,
        "min_child_samples": _min_child(rows),
        "min_data_in_bin": 1,  # small tables: every distinct weight may bound a bin
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": LGB_TRAIN_THREADS,
        "seed": seed,
        "verbose": -1,
    }


def _fit_lightgbm(x: np.ndarray, y: np.ndarray, seed: int):
    import lightgbm as lgb

    params = _lgb_params(len(y), seed)
    booster = lgb.train(params, lgb.Dataset(x, label=y, params=params), LGB_ROUNDS)

    def predict(w: np.ndarray) -> np.ndarray:
        threads = LGB_PREDICT_THREADS if len(w) >= LGB_PARALLEL_PREDICT_ROWS else 1
        return booster.predict(w, num_threads=threads)

    return predict


def _fit_linear(x: np.ndarray, y: np.ndarray, seed: int):
    """Ridge on the centred weights with a free intercept (seed unused: exact solve)."""
    del seed
    mx, my = x.mean(axis=0), float(y.mean())
    xc = x - mx
    gram = xc.T @ xc
    scale = float(np.trace(gram)) / x.shape[1]
    if scale <= 0:  # identical rows: the mean is all there is to predict
        return lambda w: np.full(len(w), my)
    coef = np.linalg.solve(gram + RIDGE_LAMBDA * scale * np.eye(x.shape[1]), xc.T @ (y - my))
    return lambda w: (w - mx) @ coef + my


_FITTERS = {"lightgbm": _fit_lightgbm, "linear": _fit_linear}


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (as scipy.stats.rankdata)."""
    order = np.argsort(a, kind="stable")
    sorted_a = a[order]
    starts = np.flatnonzero(np.r_[True, sorted_a[1:] != sorted_a[:-1]])
    ends = np.r_[starts[1:], len(a)]
    average = (starts + ends + 1) / 2.0  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(len(a))
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation, as scipy.stats.spearmanr computes it (Pearson's on
    average ranks); NaN when a side is constant. Written out because importing
    scipy.stats would cost the command line half a second."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    r = float(ra @ rb / math.sqrt(float(ra @ ra) * float(rb @ rb)))
    return max(-1.0, min(1.0, r))


def _fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    """Fold of each row: a seeded shuffle dealt round-robin into ``folds`` folds."""
    ids = np.empty(n, dtype=np.int64)
    ids[np.random.default_rng(seed).permutation(n)] = np.arange(n) % folds
    return ids


def _check_xy(weights, target, domains) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(weights, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64).reshape(-1)
    if x.ndim != 2:
        raise ValueError(f"weights must be a 2-D array (rows x domains), got shape {x.shape}")
    if len(domains) != x.shape[1]:
        raise ValueError(f"{len(domains)} domain names for {x.shape[1]} weight columns")
    if len(y) != len(x):
        raise ValueError(f"{len(y)} target values for {len(x)} rows of weights")
    if len(x) < MIN_ROWS:
        raise ValueError(
            f"a mixture regression needs at least {MIN_ROWS} rows (runs), got {len(x)}"
        )
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("weights and targets must be finite numbers")
    return x, y


def fit_regression(
    weights: np.ndarray,
    target: np.ndarray,
    domains: list[str],
    *,
    model: str = "auto",
    folds: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
) -> MixtureRegression:
    """Fit ``target`` (n,) from ``weights`` (n, k), cross-validate, refit on every row.

    ``model``: "lightgbm", "linear" (ridge on the weights) or "auto" (LightGBM from
    ``LIGHTGBM_MIN_ROWS`` rows on). Cross-validation: min(folds, n) shuffled folds
    (seeded), so leave-one-out when n < folds; Spearman, MAE and RMSE are computed on
    the pooled out-of-fold predictions."""
    x, y = _check_xy(weights, target, domains)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose one of {', '.join(MODELS)}")
    if int(folds) != folds or folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds!r}")
    n = len(x)
    chosen = model if model != "auto" else ("lightgbm" if n >= LIGHTGBM_MIN_ROWS else "linear")
    fitter = _FITTERS[chosen]
    k = min(int(folds), n)
    ids = _fold_ids(n, k, seed)
    oof = np.empty(n)
    for f in range(k):
        test = ids == f
        oof[test] = fitter(x[~test], y[~test], seed)(x[test])
    err = oof - y
    cv = CrossValidation(
        folds=k,
        spearman=spearman(oof, y),
        mae=float(np.mean(np.abs(err))),
        rmse=float(np.sqrt(np.mean(err**2))),
        predictions=oof,
    )
    if chosen == "lightgbm":
        p = _lgb_params(n, seed)
        settings = {
            "rounds": LGB_ROUNDS,
            **{k_: p[k_] for k_ in ("learning_rate", "num_leaves", "min_child_samples", "seed")},
        }
    else:
        settings = {"ridge_lambda": RIDGE_LAMBDA}
    return MixtureRegression(
        model=chosen,
        domains=list(domains),
        cv=cv,
        rows=n,
        settings=settings,
        _predict=fitter(x, y, seed),
    )
