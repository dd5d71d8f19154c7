"""One run's validation curve over training tokens, L(D) = E + A D^-alpha, fitted and
projected to a later token count with an interval (``eval.project``).

The estimator follows ``scaling.fit``: the summed Huber loss (delta = 1e-3) of the log
residuals r_i = log L_i - LSE(a - alpha x_i, e), with x_i = log(D_i / D_0) (D_0 the
curve's last token count, so that A_0 = exp(a) is the curve's own scale at D_0 and the
bounds below hold for any run length), minimized by L-BFGS-B with an analytic gradient
from several starts, the best kept. The parameters are bounded: E in [1e-6, max L]
(at or above 0, never above the curve), A_0 in [1e-8, 10 max L], alpha in [0, ALPHA_MAX].
A fit has ``converged`` when L-BFGS-B reports success from its best start.

The interval is a residual bootstrap, seeded (deterministic): the fitted log curve plus
the log residuals resampled with replacement, inflated by sqrt(n / (n - 3)) for the
three fitted parameters (a 3-parameter curve nearly interpolates 4 points: its raw
residuals understate the noise), each resample refitted from the full fit. The interval
of the projection is the resamples' percentile interval; refits that did not converge
are dropped, and when fewer than ``MIN_CONVERGED`` of them converged the fit as a whole
counts as not converged. The residuals of a training curve are correlated (the learning
rate schedule bends it), so the interval covers the noise about the law, not the law's
own error: a schedule that decays late lowers the loss faster than the early curve says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from ledgerlm.scaling.fit import DELTA, _one_blas_thread

ALPHA_MAX = 3.0
E_MIN = 1e-6
A_MIN = 1e-8
BOOTSTRAP = 200  # residual resamples of the interval
MIN_CONVERGED = 0.9  # share of the resamples' refits that must converge
OPTIONS = {"ftol": 1e-14, "gtol": 1e-10, "maxiter": 2_000, "maxfun": 4_000}
START_E = (0.0, 0.5, 0.8, 0.95)  # E as shares of the lowest loss
START_ALPHA = (0.1, 0.3, 0.7, 1.5)


@dataclass(frozen=True)
class CurveFit:
    """L(D) = E + A D^-alpha fitted to ``n`` points; ``A`` is for D in tokens."""

    E: float
    A: float
    alpha: float
    n: int
    converged: bool
    d0: float  # the tokens the fit was scaled by (the curve's last point)

    def predict(self, tokens) -> np.ndarray:
        x = np.log(np.asarray(tokens, dtype=np.float64) / self.d0)
        return self.E + self._a0 * np.exp(-self.alpha * x)

    @property
    def _a0(self) -> float:
        return self.A * self.d0 ** (-self.alpha)

    def to_dict(self) -> dict[str, float | int | bool]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "n": self.n}


@dataclass(frozen=True)
class Projection:
    """The fitted curve at ``tokens``: the fit's value and the bootstrap's ``level``
    percentile interval, ``converged`` only when the fit and its resamples did. Its
    ``to_dict`` (the ``early_stop`` event's detail) leaves the tokens to the caller."""

    fit: CurveFit
    tokens: int
    loss: float
    low: float
    high: float
    level: float
    converged: bool
    resamples: int  # refits that converged, of BOOTSTRAP

    def to_dict(self) -> dict[str, object]:
        return {
            "fit": self.fit.to_dict(),
            "projected": self.loss,
            "interval": [self.low, self.high],
            "level": self.level,
            "resamples": self.resamples,
        }


def _objective(theta, x, log_loss, delta: float = DELTA) -> tuple[float, np.ndarray]:
    """Summed Huber loss of log L_hat - log L, L_hat = exp(e) + exp(a - alpha x), and its
    gradient in theta = (e, a, alpha)."""
    e, a, alpha = theta
    u = a - alpha * x
    m = np.maximum(u, e)  # a stable log-sum-exp
    p1, p2 = np.exp(u - m), np.exp(e - m)
    s = p1 + p2
    r = m + np.log(s) - log_loss
    psi = np.clip(r, -delta, delta)
    q = psi / s
    g1 = q * p1
    return float(psi @ (r - 0.5 * psi)), np.array([q @ p2, g1.sum(), -(g1 @ x)])


def _bounds(loss: np.ndarray) -> list[tuple[float, float]]:
    top = float(np.max(loss))
    return [(math.log(E_MIN), math.log(top)), (math.log(A_MIN), math.log(10 * top)), (0, ALPHA_MAX)]


def _minimize(x, log_loss, start, bounds) -> tuple[np.ndarray, float, bool]:
    res = minimize(
        _objective,
        start,
        args=(x, log_loss),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options=OPTIONS,
    )
    return np.asarray(res.x, dtype=np.float64), float(res.fun), bool(res.success)


def _starts(loss: np.ndarray, bounds) -> list[np.ndarray]:
    lowest, last = float(np.min(loss)), float(loss[-1])
    starts = []
    for share in START_E:
        e = max(share * lowest, E_MIN)
        a = max(last - e, A_MIN)  # at x = 0 (the last point) L_hat = E + A_0
        for alpha in START_ALPHA:
            theta = np.array([math.log(e), math.log(a), alpha])
            starts.append(np.clip(theta, [b[0] for b in bounds], [b[1] for b in bounds]))
    return starts


def _as_curve(tokens, loss) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(tokens, dtype=np.float64).ravel()
    v = np.asarray(loss, dtype=np.float64).ravel()
    if d.shape != v.shape:
        raise ValueError(f"tokens and loss differ in length: {d.size} vs {v.size}")
    if d.size < 4:
        raise ValueError(f"a curve of 3 parameters needs 4 points or more, got {d.size}")
    if np.any(~np.isfinite(d)) or np.any(d <= 0) or np.any(~np.isfinite(v)) or np.any(v <= 0):
        raise ValueError("tokens and loss must be finite and positive")
    return d, v


def _fit_theta(x, log_loss, bounds, starts) -> tuple[np.ndarray, bool]:
    best = None
    for start in starts:
        theta, value, ok = _minimize(x, log_loss, start, bounds)
        if best is None or value < best[1]:
            best = (theta, value, ok)
    return best[0], best[2]


def _curve(theta, n: int, converged: bool, d0: float) -> CurveFit:
    e, a, alpha = (float(v) for v in theta)
    return CurveFit(math.exp(e), math.exp(a) * d0**alpha, alpha, n, converged, d0)


def fit_curve(tokens: Sequence[float], loss: Sequence[float]) -> CurveFit:
    """The Huber fit of L(D) = E + A D^-alpha to a curve of 4 points or more."""
    d, v = _as_curve(tokens, loss)
    d0 = float(d[-1])
    bounds = _bounds(v)
    with _one_blas_thread():
        theta, ok = _fit_theta(np.log(d / d0), np.log(v), bounds, _starts(v, bounds))
    return _curve(theta, d.size, ok, d0)


def project(
    tokens: Sequence[float],
    loss: Sequence[float],
    at: int,
    level: float = 0.95,
    seed: int = 0,
    resamples: int = BOOTSTRAP,
) -> Projection:
    """The curve fitted to (``tokens``, ``loss``) projected to ``at`` tokens, with the
    ``level`` interval of the seeded residual bootstrap (see the module's docstring)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    d, v = _as_curve(tokens, loss)
    d0 = float(d[-1])
    x, log_loss, bounds = np.log(d / d0), np.log(v), _bounds(v)
    x_at = math.log(at / d0)
    with _one_blas_thread():
        theta, ok = _fit_theta(x, log_loss, bounds, _starts(v, bounds))
        fitted = np.logaddexp(theta[1] - theta[2] * x, theta[0])
        residuals = (log_loss - fitted) * math.sqrt(d.size / (d.size - 3))
        rng = np.random.default_rng(seed)
        ends = []
        for _ in range(resamples):
            y = fitted + rng.choice(residuals, size=d.size, replace=True)
            refit, refit_ok = _minimize(x, y, theta, bounds)[::2]
            if refit_ok:
                ends.append(math.exp(refit[0]) + math.exp(refit[1] - refit[2] * x_at))
    fit = _curve(theta, d.size, ok, d0)
    tail = 50.0 * (1.0 - level)
    low, high = np.percentile(ends, [tail, 100.0 - tail]) if ends else (math.nan, math.nan)
    converged = ok and len(ends) >= MIN_CONVERGED * resamples
    value = float(fit.predict([at])[0])
    return Projection(fit, int(at), value, float(low), float(high), level, converged, len(ends))
