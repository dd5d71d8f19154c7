"""Fitting the parametric scaling law L(N, D) = E + A N^-alpha + B D^-beta (requirement S2).

The estimator is Hoffmann et al. (2022)'s "Approach 3" as replicated by Besiroglu
et al. (2024, "Chinchilla scaling: a replication attempt"): minimize the Huber
loss (delta = 1e-3), summed over the points, of the log-loss residuals

    r_i = log L_i - LSE(a - alpha log N_i, b - beta log D_i, e)

with A = exp(a), B = exp(b), E = exp(e) and LSE the log-sum-exp. The initial
points are Hoffmann's grid (alpha, beta in {0, 0.5, ..., 2}; e in {-1, -0.5,
..., 1}; a, b in {0, 5, ..., 25}: 4,500 starts), evaluated with numpy over blocks
of points (``grid_objective``: the product's terms computed once per point, the sums
accumulated per start); the best few are polished with L-BFGS-B (analytic gradient,
tight tolerances) and the best result is kept. The objective too takes the points a
pass of ``ROWS`` at a time: the grid search and every evaluation of the objective work
in a few MB whatever the number of points, so a fit's memory is its points' arrays.

Two details decide whether the optimizer converges. The objective is summed,
not averaged: L-BFGS-B's ``ftol`` test is relative to max(|f|, 1), so a mean
Huber loss (about 4e-6 on the reference points) makes the default ``ftol`` an absolute threshold
that stops the search almost at once, which is how Hoffmann's published
estimates stopped short (Besiroglu et al.). And the tolerances are set tight
(``ftol=1e-15``, ``gtol=1e-10``) for the same reason.

The optimizer works on theta = (e, a, b, alpha, beta): the logs of E, A, B and
the two exponents, in the order of ``law.NAMES``.

Also here: the bootstrap (resampled points, warm-started from the full fit),
errors on held-out points, and the isoFLOP estimator ("Approach 2").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from ledgerlm.scaling.law import KAPPA, NAMES, LawParams, flops
from ledgerlm.scaling.replicates import group_ids

DELTA = 1e-3

# Hoffmann et al. (2022), appendix D.2, reused by Besiroglu et al. (2024):
# alpha, beta in {0, 0.5, ..., 2}; e in {-1, -0.5, ..., 1}; a, b in {0, 5, ..., 25}.
HOFFMANN_GRID: dict[str, np.ndarray] = {
    "e": np.arange(-1.0, 1.5, 0.5),
    "a": np.arange(0.0, 30.0, 5.0),
    "b": np.arange(0.0, 30.0, 5.0),
    "alpha": np.arange(0.0, 2.5, 0.5),
    "beta": np.arange(0.0, 2.5, 0.5),
}

# Tight L-BFGS-B settings for the full fit and the bootstrap refits.
TIGHT = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 20_000, "maxfun": 40_000}

# The box L-BFGS-B searches, in theta order (e, a, b, alpha, beta). On points that do
# not determine the law (few sizes, noisy losses) the Huber objective keeps falling
# towards an infinite exponent: A N^-alpha turns into a step between two sizes, and
# exp(a), exp(b) overflow. The exponents stay in [0, EXPONENT_MAX]: a negative one is a
# loss that rises with scale, and published language-model exponents lie in 0.05-0.8
# (the grid's largest is 2), so a fit at 5 says the points do not bound it; a and b stay
# below LOG_SCALE_MAX, where A = e^300 is finite and A N^-alpha with it. A parameter
# that ends on an edge of the box is reported as degenerate (``diagnose``), not fitted.
EXPONENT_MAX = 5.0
LOG_SCALE_MAX = 300.0
BOUNDS = (
    (None, None),
    (None, LOG_SCALE_MAX),
    (None, LOG_SCALE_MAX),
    (0.0, EXPONENT_MAX),
    (0.0, EXPONENT_MAX),
)

# Points per pass of the objective, and (point, grid point) pairs per block of the grid
# search: the memory of a fit does not grow with its number of points. A pass's arrays
# (64 KB) stay under glibc's threshold for mapping memory afresh: at 32,768 points each
# call of the objective page-faulted its temporaries in again and ran 5x slower.
ROWS = 8192
BLOCK = 1 << 18


# ---------------------------------------------------------------------------
# objective


def _as_points(N, D, loss=None):
    N = np.asarray(N, dtype=np.float64).ravel()
    D = np.asarray(D, dtype=np.float64).ravel()
    if N.shape != D.shape:
        raise ValueError(f"N and D differ in length: {N.size} vs {D.size}")
    if np.any(~np.isfinite(N)) or np.any(N <= 0) or np.any(~np.isfinite(D)) or np.any(D <= 0):
        raise ValueError("N and D must be finite and positive")
    if loss is None:
        return N, D
    loss = np.asarray(loss, dtype=np.float64).ravel()
    if loss.shape != N.shape:
        raise ValueError(f"loss and N differ in length: {loss.size} vs {N.size}")
    if np.any(~np.isfinite(loss)) or np.any(loss <= 0):
        raise ValueError("loss must be finite and positive")
    return N, D, loss


def theta_to_params(theta) -> LawParams:
    """(e, a, b, alpha, beta) -> LawParams(E, A, B, alpha, beta)."""
    e, a, b, alpha, beta = (float(v) for v in theta)
    return LawParams(float(np.exp(e)), float(np.exp(a)), float(np.exp(b)), alpha, beta)


def params_to_theta(params: LawParams) -> np.ndarray:
    """LawParams -> (e, a, b, alpha, beta)."""
    return np.array(
        [np.log(params.E), np.log(params.A), np.log(params.B), params.alpha, params.beta]
    )


def log_predict(theta, log_N, log_D) -> np.ndarray:
    """log L_hat = LSE(a - alpha log N, b - beta log D, e), broadcast over points."""
    e, a, b, alpha, beta = theta
    return np.logaddexp(np.logaddexp(a - alpha * log_N, b - beta * log_D), e)


def huber(r, delta: float = DELTA) -> np.ndarray:
    """Huber loss: r^2 / 2 for |r| <= delta, delta (|r| - delta / 2) beyond."""
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta))


def _huber_terms(theta, log_N, log_D, log_loss, delta, weights) -> tuple[float, np.ndarray]:
    e, a, b, alpha, beta = theta
    u1 = a - alpha * log_N
    u2 = b - beta * log_D
    m = np.maximum(np.maximum(u1, u2), e)  # shift for a stable log-sum-exp
    p1 = np.exp(u1 - m)
    p2 = np.exp(u2 - m)
    p3 = np.exp(e - m)
    s = p1 + p2 + p3
    r = m + np.log(s) - log_loss  # predicted minus observed; Huber is symmetric
    psi = np.clip(r, -delta, delta)  # dHuber/dr
    # Huber(r) = psi (r - psi / 2): r^2 / 2 inside [-delta, delta], delta (|r| - delta / 2) out.
    if weights is not None:
        psi_w = psi * weights
        value = psi_w @ (r - 0.5 * psi)
    else:
        psi_w = psi
        value = psi @ (r - 0.5 * psi)
    q = psi_w / s
    g1 = q * p1  # dr/da is the softmax weight of the first term
    g2 = q * p2
    grad = np.array([q @ p3, g1.sum(), g2.sum(), -(g1 @ log_N), -(g2 @ log_D)])
    return float(value), grad


def huber_objective(
    theta, log_N, log_D, log_loss, delta: float = DELTA, weights=None, rows: int = ROWS
) -> tuple[float, np.ndarray]:
    """Summed Huber loss of the log residuals and its gradient with respect to theta.

    ``theta`` = (e, a, b, alpha, beta); ``weights`` (optional) multiplies each
    point's term, so integer counts give a bootstrap resample without copying. The
    points are taken ``rows`` at a time (views, the sums accumulated), so the
    temporaries stay the same size whatever the number of points; up to ``rows``
    points it is one pass.
    """
    n = len(log_loss)
    if n <= rows:
        return _huber_terms(theta, log_N, log_D, log_loss, delta, weights)
    value, grad = 0.0, np.zeros(5)
    for lo in range(0, n, rows):
        part = slice(lo, lo + rows)
        w = None if weights is None else weights[part]
        f, g = _huber_terms(theta, log_N[part], log_D[part], log_loss[part], delta, w)
        value += f
        grad += g
    return value, grad


def _grid_block(axes, log_N, log_D, log_loss, delta, work) -> np.ndarray:
    """The summed Huber loss of a few points at every grid point, shape (E, A, B, AL, BE).

    The grid is a Cartesian product, so exp(a - alpha log N) takes only |a| x |alpha|
    values per point (and exp(b - beta log D) |b| x |beta|): those are computed once per
    point, shifted by the point's largest exponent, and each grid point's log-sum-exp is
    the log of a sum of three of them. A grid point whose three terms all underflow after
    the shift gets its log-sum-exp directly instead. ``work``: three buffers of at least
    the points' number of rows, reused from block to block (fresh arrays of this size
    would be mapped and unmapped each time)."""
    e, a, b, alpha, beta = axes
    n = len(log_loss)
    r, psi, tmp = (w[:n] for w in work)
    u1 = a[None, :, None] - alpha[None, None, :] * log_N[:, None, None]  # (n, A, AL)
    u2 = b[None, :, None] - beta[None, None, :] * log_D[:, None, None]  # (n, B, BE)
    m = np.maximum(np.maximum(u1.max(axis=(1, 2)), u2.max(axis=(1, 2))), e.max())
    x1 = np.exp(u1 - m[:, None, None])[:, None, :, None, :, None]
    x2 = np.exp(u2 - m[:, None, None])[:, None, None, :, None, :]
    x3 = np.exp(e[None, :] - m[:, None])[:, :, None, None, None, None]
    np.add(x3 + x1, x2, out=r)
    # a sum is 0 only where its three terms are: never when one kind of term is never 0
    lost = None if (x3 > 0).all() or (x1 > 0).all() or (x2 > 0).all() else r == 0
    with np.errstate(divide="ignore"):
        np.log(r, out=r)
    if lost is not None and lost.any():
        i, ie, ia, ib, ial, ibe = np.nonzero(lost)
        r[lost] = np.logaddexp(np.logaddexp(u1[i, ia, ial], u2[i, ib, ibe]), e[ie]) - m[i]
    r += (m - log_loss)[:, None, None, None, None, None]  # predicted minus observed
    np.clip(r, -delta, delta, out=psi)
    r -= np.multiply(psi, 0.5, out=tmp)
    r *= psi  # Huber(r) = psi (r - psi / 2), as in huber_objective
    return r.sum(axis=0)


def grid_objective(
    grid: dict[str, np.ndarray] | None,
    log_N,
    log_D,
    log_loss,
    delta: float = DELTA,
    block: int = BLOCK,
) -> np.ndarray:
    """Summed Huber loss at every point of the initialization grid (``grid``: its axes,
    keys e, a, b, alpha, beta; None for Hoffmann's), in ``make_grid``'s row order.

    The points are streamed in blocks of about ``block`` (point, grid point) pairs and
    the sums accumulated per grid point, so the memory used is a few blocks whatever the
    number of points (and the grid's own size)."""
    grid = HOFFMANN_GRID if grid is None else grid
    axes = [np.asarray(grid[k], dtype=np.float64).ravel() for k in ("e", "a", "b", "alpha", "beta")]
    out = np.zeros([len(x) for x in axes])
    rows = max(1, min(block // out.size, len(log_loss)))
    work = [np.empty((rows, *out.shape)) for _ in range(3)]
    for lo in range(0, len(log_loss), rows):
        part = slice(lo, lo + rows)
        out += _grid_block(axes, log_N[part], log_D[part], log_loss[part], delta, work)
    return out.ravel()


def make_grid(grid: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The Cartesian product of the initialization grid, rows in theta order."""
    grid = HOFFMANN_GRID if grid is None else grid
    axes = [np.asarray(grid[k], dtype=np.float64) for k in ("e", "a", "b", "alpha", "beta")]
    return np.array(list(itertools.product(*axes)), dtype=np.float64)


def _one_blas_thread():
    """L-BFGS-B's 5-variable linear algebra calls BLAS. A multi-threaded OpenBLAS hands
    even these tiny calls to worker threads, and on a busy machine each hand-off waits
    for a scheduler tick: measured up to 8 ms per iteration, fits 100x slower."""
    return threadpool_limits(limits=1, user_api="blas")


def _lbfgs(fun, x0, args, options) -> tuple[np.ndarray, float, int]:
    res = minimize(fun, x0, args=args, jac=True, method="L-BFGS-B", bounds=BOUNDS, options=options)
    return np.asarray(res.x, dtype=np.float64), float(res.fun), int(res.nit)


# ---------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class HeldOut:
    """Errors of a fitted law on points it did not see.

    In nat/token: ``mae``, ``rmse``, ``bias`` = mean(predicted - observed) (negative:
    the law is optimistic, it promises a lower loss than was reached), and the largest
    relative error |predicted - observed| / observed; in log space the RMS and maximum
    of log L - log L_hat."""

    n: int
    rmse_log: float  # root mean square of log L - log L_hat
    max_abs_log: float
    max_abs_loss: float  # in nat/token
    residuals: np.ndarray  # log L - log L_hat per point
    extrapolated: np.ndarray  # bool per point: outside the fitted range of N, D, C or D/N
    predicted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    observed: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def errors(self) -> np.ndarray:
        """predicted - observed per point (nat/token)."""
        return self.predicted - self.observed

    @property
    def mae(self) -> float:
        return float(np.mean(np.abs(self.errors)))

    @property
    def rmse(self) -> float:
        return float(np.sqrt(np.mean(self.errors**2)))

    @property
    def bias(self) -> float:
        return float(np.mean(self.errors))

    @property
    def max_rel_error(self) -> float:
        return float(np.max(np.abs(self.errors) / self.observed))

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "mae": self.mae,
            "rmse": self.rmse,
            "bias": self.bias,
            "max_rel_error": self.max_rel_error,
            "rmse_log": self.rmse_log,
            "max_abs_log": self.max_abs_log,
            "max_abs_loss": self.max_abs_loss,
            "n_extrapolated": int(self.extrapolated.sum()),
        }


@dataclass(frozen=True)
class Bootstrap:
    """Bootstrap refits: ``samples`` is (n, 5) in ``law.NAMES`` order (E, A, B, alpha, beta)."""

    samples: np.ndarray
    seed: int
    names: tuple[str, ...] = field(default=NAMES)

    def __len__(self) -> int:
        return len(self.samples)

    def column(self, name: str) -> np.ndarray:
        return self.samples[:, self.names.index(name)]

    def interval(self, name: str, level: float = 0.95) -> tuple[float, float]:
        """Percentile interval of one parameter."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        tail = 50.0 * (1.0 - level)
        lo, hi = np.percentile(self.column(name), [tail, 100.0 - tail])
        return float(lo), float(hi)

    def intervals(self, level: float = 0.95) -> dict[str, tuple[float, float]]:
        return {name: self.interval(name, level) for name in self.names}

    def params(self) -> list[LawParams]:
        return [LawParams.from_array(row) for row in self.samples]


class ScalingLaw:
    """Huber fit of L = E + A N^-alpha + B D^-beta on log loss (scikit-learn style).

    ``delta``: Huber threshold on log residuals. ``n_starts``: how many of the best
    grid points L-BFGS-B polishes. ``grid``: initialization axes (keys e, a, b,
    alpha, beta; default Hoffmann's). ``reduction``: "sum" (default) or "mean"
    (Hoffmann's original, kept for comparison). ``options``: L-BFGS-B options
    (default ``TIGHT``; ``{}`` gives scipy's defaults).

    After ``fit``: ``params_`` (LawParams), ``theta_`` (e, a, b, alpha, beta),
    ``loss_`` (the objective at the optimum, as reduced), ``n_iter_``, ``residuals_``
    (log L - log L_hat per point), ``n_points_``, ``groups_`` (one id per point, equal
    for points of one (N, D)) and ``range_`` (min and max of N, D, C = 6ND and the
    tokens per parameter D/N over the fitted points).
    """

    def __init__(
        self,
        delta: float = DELTA,
        n_starts: int = 8,
        grid: dict[str, np.ndarray] | None = None,
        reduction: str = "sum",
        options: dict | None = None,
    ):
        self.delta = delta
        self.n_starts = n_starts
        self.grid = grid
        self.reduction = reduction
        self.options = options

    def _objective(self):
        if self.reduction == "sum":
            return huber_objective
        if self.reduction == "mean":

            def mean_objective(theta, log_N, log_D, log_loss, delta, weights):
                f, g = huber_objective(theta, log_N, log_D, log_loss, delta, weights)
                n = len(log_loss) if weights is None else float(np.sum(weights))
                return f / n, g / n

            return mean_objective
        raise ValueError(f"reduction must be 'sum' or 'mean', got {self.reduction!r}")

    def _options(self) -> dict:
        return dict(TIGHT if self.options is None else self.options)

    def fit(self, N, D, loss) -> ScalingLaw:
        N, D, loss = _as_points(N, D, loss)
        if N.size < 5:
            raise ValueError(f"need at least 5 points to fit 5 parameters, got {N.size}")
        log_N, log_D, log_loss = np.log(N), np.log(D), np.log(loss)
        objective = self._objective()
        options = self._options()
        grid = make_grid(self.grid)
        grid_f = grid_objective(self.grid, log_N, log_D, log_loss, self.delta)
        order = np.argsort(grid_f, kind="stable")[: max(1, self.n_starts)]
        args = (log_N, log_D, log_loss, self.delta, None)
        best = None
        with _one_blas_thread():
            for i in order:
                x, f, nit = _lbfgs(objective, grid[i], args, options)
                if np.isfinite(f) and (best is None or f < best[1]):
                    best = (x, f, nit)
        if best is None:
            raise RuntimeError("every L-BFGS-B start failed")
        self.theta_, self.loss_, self.n_iter_ = best
        self.params_ = theta_to_params(self.theta_)
        self.residuals_ = log_loss - log_predict(self.theta_, log_N, log_D)
        self.n_points_ = int(N.size)
        self.groups_ = group_ids(N, D)
        C, ratio = flops(N, D), D / N
        self.range_ = {
            "N": (float(N.min()), float(N.max())),
            "D": (float(D.min()), float(D.max())),
            "C": (float(C.min()), float(C.max())),
            "D/N": (float(ratio.min()), float(ratio.max())),
        }
        self._data = (log_N, log_D, log_loss)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "params_"):
            raise RuntimeError("ScalingLaw is not fitted yet: call fit(N, D, loss) first")

    def predict(self, N, D) -> np.ndarray:
        """Predicted loss (nat/token) at N parameters and D tokens (broadcast)."""
        self._check_fitted()
        return self.params_.predict(N, D)

    def extrapolates(self, N, D) -> np.ndarray:
        """True where (N, D) lies outside the fitted range of N, D, C = 6ND or the tokens
        per parameter D/N: a point inside every axis's range can still be a model trained
        far longer (or shorter) for its size than any fitted run."""
        self._check_fitted()
        N = np.asarray(N, dtype=np.float64)
        D = np.asarray(D, dtype=np.float64)
        C = flops(N, D)
        out = np.zeros(np.broadcast(N, D).shape, dtype=bool)
        for key, x in (("N", N), ("D", D), ("C", C), ("D/N", D / N)):
            lo, hi = self.range_[key]
            out |= (x < lo) | (x > hi)
        return out

    def evaluate_held_out(self, N, D, loss) -> HeldOut:
        """Errors on points not used in the fit (log space and nat/token)."""
        self._check_fitted()
        N, D, loss = _as_points(N, D, loss)
        pred = self.predict(N, D)
        r = np.log(loss) - np.log(pred)
        return HeldOut(
            n=int(N.size),
            rmse_log=float(np.sqrt(np.mean(r * r))),
            max_abs_log=float(np.max(np.abs(r))),
            max_abs_loss=float(np.max(np.abs(loss - pred))),
            residuals=r,
            extrapolated=self.extrapolates(N, D),
            predicted=np.asarray(pred, dtype=np.float64),
            observed=loss,
        )

    def score(self, N, D, loss) -> float:
        """Minus the RMSE of log loss on (N, D, loss): higher is better, as in scikit-learn."""
        return -self.evaluate_held_out(N, D, loss).rmse_log

    def bootstrap(self, n: int = 200, seed: int = 0) -> Bootstrap:
        """Refit on ``n`` resamples of the fitted (N, D) groups (with replacement).

        A cluster bootstrap: the unit drawn is an (N, D) pair with all its rows, so
        replicates and duplicated rows of one point never count as independent evidence
        (with one row per (N, D) it is the ordinary bootstrap over points). Each refit
        starts L-BFGS-B from the full fit's optimum (no grid search) and weights each
        point by how often its group was drawn, which equals fitting the resampled list.
        """
        self._check_fitted()
        log_N, log_D, log_loss = self._data
        groups = self.groups_
        m = int(groups.max()) + 1
        rng = np.random.default_rng(seed)
        objective = self._objective()
        options = self._options()
        samples = np.empty((n, 5))
        with _one_blas_thread():
            for k in range(n):
                counts = np.bincount(rng.integers(0, m, size=m), minlength=m)[groups]
                keep = counts > 0
                args = (log_N[keep], log_D[keep], log_loss[keep], self.delta, counts[keep])
                x, _, _ = _lbfgs(objective, self.theta_, args, options)
                samples[k] = theta_to_params(x).as_array()
        return Bootstrap(samples=samples, seed=seed)


# ---------------------------------------------------------------------------
# isoFLOP profiles (Hoffmann et al.'s Approach 2)


def cluster_budgets(
    C, tol_dex: float = 0.05, min_points: int = 5
) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Group compute budgets by clustering log10 C around its densest values.

    Repeatedly: the window of width 2 ``tol_dex`` decades holding the most ungrouped
    points gives a budget (the mean of its points' log10 C), and every ungrouped point
    within ``tol_dex`` of that budget joins it; this stops when no window holds
    ``min_points``. Points between budgets (runs read off training curves rather than
    isoFLOP profiles) are left out rather than chained into one wide group. It needs
    no grid: budgets of 1.25e16 x 2^k group as well as {1, 3, 6} x 10^k.

    Returns a label per point (its budget's geometric-mean C; NaN when left out) and
    the (reason, count) of the points left out."""
    x = np.log10(np.asarray(C, dtype=np.float64))
    labels = np.full(x.shape, np.nan)
    free = np.ones(x.shape, dtype=bool)
    while free.sum() >= min_points:
        idx = np.flatnonzero(free)
        order = np.argsort(x[idx], kind="stable")
        xs = x[idx][order]
        lo = np.searchsorted(xs, xs - tol_dex, side="left")
        hi = np.searchsorted(xs, xs + tol_dex, side="right")
        best = int(np.argmax(hi - lo))
        if hi[best] - lo[best] < min_points:
            break
        centre = xs[lo[best] : hi[best]].mean()
        members = idx[np.abs(x[idx] - centre) <= tol_dex]
        labels[members] = 10.0 ** x[members].mean()
        free[members] = False
    left = int(free.sum())
    reason = f"not within {tol_dex:g} dex of a budget with {min_points} or more points"
    return labels, [(reason, left)] if left else []


@dataclass(frozen=True)
class IsoFlopProfile:
    """One budget: loss vs log N fitted by a parabola, its minimum."""

    C: float  # the budget (given, or the geometric mean of the group's kappa N D)
    level: float  # the label the points were grouped by
    n: int
    N_opt: float
    D_opt: float  # C / (kappa N_opt)
    L_opt: float  # the parabola's minimum (nat/token)
    interior: bool  # the minimum lies inside the sampled range of N
    curvature: float  # the parabola's coefficient of (log N)^2; > 0 for a minimum


@dataclass(frozen=True)
class IsoFlopFit:
    """N_opt = k_N C^a and D_opt = k_D C^b, least squares in log-log over the profiles used.

    Because D_opt = C / (kappa N_opt), b = 1 - a and k_D = 1 / (kappa k_N) exactly.
    """

    a: float
    k_N: float
    b: float
    k_D: float
    profiles: tuple[IsoFlopProfile, ...]  # every group with enough points
    used: tuple[bool, ...]  # whether each profile entered the power-law fit
    rule: str  # how points were grouped into budgets
    grouped: int = 0  # points in a profile
    dropped: tuple[tuple[str, int], ...] = ()  # (reason, points) left out
    labels: tuple[float, ...] = ()  # per input point: its profile's level; NaN if in none

    def members(self, profile: IsoFlopProfile) -> np.ndarray:
        """Which input points ``profile`` was fitted on (a boolean mask)."""
        return np.asarray(self.labels, dtype=np.float64) == profile.level

    @property
    def warnings(self) -> list[str]:
        """A warning when more than a quarter of the points were left out."""
        lost = sum(n for _, n in self.dropped)
        total = lost + self.grouped
        if not total or lost <= total / 4:
            return []
        reasons = "; ".join(f"{n} {why}" for why, n in self.dropped)
        return [f"isoFLOP grouping left out {lost} of {total} points ({reasons})"]

    def N_opt(self, C) -> np.ndarray:
        return self.k_N * np.asarray(C, dtype=np.float64) ** self.a

    def D_opt(self, C) -> np.ndarray:
        return self.k_D * np.asarray(C, dtype=np.float64) ** self.b


def isoflop_fit(
    N,
    D,
    loss,
    C=None,
    *,
    levels=None,
    tol_dex: float = 0.05,
    min_points: int = 5,
    kappa: float = KAPPA,
) -> IsoFlopFit:
    """Approach 2: per compute budget, the loss-minimizing N; then power laws in C.

    Grouping: with ``C`` (one budget label per point, e.g. a sweep's nominal
    budgets), points with equal C form one profile and C is its budget. Without
    it, the points' compute kappa N D is clustered in log10 (``cluster_budgets``:
    gaps wider than ``tol_dex`` decades separate budgets, default 0.05, i.e. 12%),
    whatever grid the budgets were on; with ``levels``, each point is snapped to the
    nearest level instead and kept only within ``tol_dex`` of it. The profile's
    budget is then the geometric mean of its points' kappa N D, so D_opt = C / (kappa
    N_opt) stays consistent with the points' own D. The result counts the points
    grouped and those left out, by reason (``warnings`` when over a quarter are).

    Per profile (at least ``min_points`` points): loss = c2 (log N)^2 + c1 log N +
    c0 by least squares, N_opt = exp(-c1 / (2 c2)). Profiles with c2 <= 0 or a
    minimum outside their sampled N range are kept in ``profiles`` but not used.
    """
    N, D, loss = _as_points(N, D, loss)
    dropped: list[tuple[str, int]] = []
    if C is None and levels is None:
        Cp = flops(N, D, kappa)
        labels, dropped = cluster_budgets(Cp, tol_dex, min_points)
        rule = (
            f"kappa N D clustered in log10 around its densest values (within {tol_dex:g} "
            "dex of a budget); "
            f"{int(np.isfinite(labels).sum())} of {N.size} points grouped"
        )
    elif C is None:
        Cp = flops(N, D, kappa)
        lv = np.asarray(levels, dtype=np.float64)
        dist = np.log10(Cp)[:, None] - np.log10(lv)[None, :]
        nearest = np.argmin(np.abs(dist), axis=1)
        ok = np.abs(dist[np.arange(N.size), nearest]) <= tol_dex
        labels = np.where(ok, lv[nearest], np.nan)
        if (~ok).sum():
            dropped.append(
                (f"farther than {tol_dex:g} dex from every given level", int((~ok).sum()))
            )
        rule = (
            f"kappa N D snapped to the nearest given budget in log10 within {tol_dex:g} dex; "
            f"{int(ok.sum())} of {N.size} points grouped"
        )
    else:
        labels = np.broadcast_to(np.asarray(C, dtype=np.float64), N.shape).copy()
        if np.any(~np.isfinite(labels)) or np.any(labels <= 0):
            raise ValueError("C must be finite and positive")
        Cp = labels
        rule = "points grouped by their given budget C"
    profiles: list[IsoFlopProfile] = []
    small = 0
    for level in np.unique(labels[np.isfinite(labels)]):
        g = labels == level
        if g.sum() < min_points:
            small += int(g.sum())
            labels[g] = np.nan
            continue
        x = np.log(N[g])
        c2, c1, c0 = np.polyfit(x, loss[g], 2)
        budget = float(np.exp(np.mean(np.log(Cp[g]))))
        x_opt = -c1 / (2.0 * c2) if c2 != 0 else np.nan
        interior = bool(c2 > 0 and x.min() <= x_opt <= x.max())
        N_opt = float(np.exp(x_opt)) if np.isfinite(x_opt) else np.nan
        L_opt = float(np.polyval([c2, c1, c0], x_opt)) if np.isfinite(x_opt) else np.nan
        profiles.append(
            IsoFlopProfile(
                C=budget,
                level=float(level),
                n=int(g.sum()),
                N_opt=N_opt,
                D_opt=budget / (kappa * N_opt) if np.isfinite(N_opt) else np.nan,
                L_opt=L_opt,
                interior=interior,
                curvature=float(c2),
            )
        )
    if small:
        rule += f"; {small} in budgets with fewer than {min_points} points left out"
        dropped.append((f"in budgets with fewer than {min_points} points", small))
    used = tuple(p.interior for p in profiles)
    if sum(used) < 2:
        raise ValueError(
            f"need at least 2 budgets with an interior minimum, got {sum(used)} ({rule})"
        )
    logC = np.log([p.C for p, u in zip(profiles, used, strict=True) if u])
    logN = np.log([p.N_opt for p, u in zip(profiles, used, strict=True) if u])
    a, log_k = np.polyfit(logC, logN, 1)
    logD = logC - np.log(kappa) - logN
    b, log_kD = np.polyfit(logC, logD, 1)
    return IsoFlopFit(
        a=float(a),
        k_N=float(np.exp(log_k)),
        b=float(b),
        k_D=float(np.exp(log_kD)),
        profiles=tuple(profiles),
        used=used,
        rule=rule,
        grouped=int(sum(p.n for p in profiles)),
        dropped=tuple(dropped),
        labels=tuple(float(x) for x in labels),
    )
