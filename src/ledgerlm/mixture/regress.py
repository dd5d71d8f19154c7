"""The mixture regression (RegMix style): from the domain weights of proxy runs to a result.

A table of proxy runs, one row per run, holds the weight of every domain (a mixture: the
row sums to 1) and one or more results (say the validation loss). ``fit_regression``
learns the result from the weights, boosted trees (LightGBM) when there are enough rows
and a ridge regression on the weights for a handful, and measures the quality of the
fit by k-fold cross-validation: Spearman's rank correlation of the out-of-fold
predictions (what a mixture search needs is the ranking), their MAE and RMSE.
``recommend`` then follows RegMix (Liu et al. 2024): draw many candidate mixtures from a
Dirichlet around a center, predict each, and average the ``top_k`` best.

``read_mixture_table`` reads such a table from a CSV file (``ledgerlm.tables``) with
one-line errors naming the file and the line; weights rounded for print (a published
table's 3 decimals) are renormalized when their rounding explains their sum. Nothing
here imports the rest of ledgerlm but its CSV reader; LightGBM is imported when first
used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.tables import read_csv

# -- defaults, seeds and tolerances -----------------------------------------------------

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

#: Candidates ``recommend`` draws, the best it averages, and how many it scores at once
#: (memory: ``RECOMMEND_CHUNK`` x domains float64s, 2.2 MB for 17 domains).
DEFAULT_CANDIDATES = 100_000
DEFAULT_TOP_K = 100
RECOMMEND_CHUNK = 16_384

#: ``concentration_of`` falls back to this many times the number of domains when the
#: rows do not determine the concentration (one row, identical rows): Dirichlet(1, ..., 1)
#: around a uniform center, the uniform distribution on the simplex.
FALLBACK_CONCENTRATION_PER_DOMAIN = 1.0
#: Bounds of an estimated concentration: rows spread wider than any Dirichlet allows give
#: the lower one, rows that barely vary the upper one.
CONCENTRATION_RANGE = (1e-2, 1e6)

#: A row's weights must sum to 1 within this before it is renormalised to exactly 1, or
#: within the rounding of their printed decimals (``rounding_tolerance``: published
#: tables print weights to 3 decimals, and 17 of them may sum to 0.996 or 1.003).
SUM_TOLERANCE = 1e-3


# -- Dirichlet draws around a center -----------------------------------------------------


def _center(center: np.ndarray) -> np.ndarray:
    c = np.asarray(center, dtype=np.float64)
    if c.ndim != 1 or c.size < 1:
        raise ValueError(f"a mixture center must be one row of weights, got shape {c.shape}")
    if not np.all(np.isfinite(c)) or np.any(c < 0) or c.sum() <= 0:
        raise ValueError("a mixture center needs finite weights >= 0 with a positive sum")
    return c / c.sum()


def _draw(rng: np.random.Generator, center: np.ndarray, concentration: float, n: int):
    """``n`` rows from Dirichlet(concentration x center) on the positive domains."""
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
    c = _center(center)
    if not (math.isfinite(concentration) and concentration > 0):
        raise ValueError(f"the concentration must be a positive number, got {concentration!r}")
    if n < 0:
        raise ValueError(f"cannot draw {n} mixtures")
    return _draw(np.random.default_rng(seed), c, float(concentration), int(n))


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


# -- the recommended mixture -------------------------------------------------------------


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
    c = _center(center)
    if not (math.isfinite(concentration) and concentration > 0):
        raise ValueError(f"the concentration must be a positive number, got {concentration!r}")
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
        w = _draw(rng, c, float(concentration), m)
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


# -- reading a table of runs -------------------------------------------------------------


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
    ``ValueError``s naming the file and line (the header is line 1)."""
    path = Path(path)
    csv = read_csv(path)
    header_line, header, rows = csv.header_line, csv.header, csv.rows
    where = f"{path}:{header_line}"
    for name in [*([target] if target is not None else []), *ignore]:
        if name not in header:
            what = "--target" if name == target else "--ignore"
            raise ValueError(
                f"{where}: {what} column {name!r} is not in the header "
                f"(columns: {_column_list(header)})"
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
