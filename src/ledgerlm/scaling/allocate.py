"""Where to spend compute: the compute-optimal split and the lifecycle-optimal one.

Under a training budget C = kappa N D the law L = E + A N^-alpha + B D^-beta is
minimised where the two marginal returns balance (requirement S3):

    alpha A N^-alpha = beta B D^-beta
    N* = G (C/kappa)^(beta/(alpha+beta)),  D* = (C/kappa) / N*,
    G  = (alpha A / (beta B))^(1/(alpha+beta)).

A model that will also serve R requests costs more than its training (requirement S4):

    C_total = C_train + R C_inference,  C_train = kappa N D,
    C_inference = inference_kappa N tokens_per_request   (forward only, ~2 N per token).

Prompt length and generated length enter through ``tokens_per_request``; batch
size changes utilisation, not FLOPs, and the attention term quadratic in
context is left out (as it is in 6ND). With R > 0 the optimum moves to smaller
N trained on more tokens: every parameter is paid for again on each request.

Everything is pure numpy. Both lifecycle objectives are log-convex in log N,
so the 1-D optimum is found by bisection on the sign of the analytic derivative:
no step sizes to tune, and the answer is accurate to float precision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ledgerlm.scaling.law import KAPPA, LawParams

INFERENCE_KAPPA = 2.0
"""Forward-pass FLOPs per parameter per token (a dense decoder, no backward)."""

_MAX_BISECT = 400
_MAX_EXPAND = 200


# --------------------------------------------------------------------------- S3


def _check_params(A, B, alpha, beta) -> None:
    for name, v in (("A", A), ("B", B), ("alpha", alpha), ("beta", beta)):
        if not np.all(np.asarray(v) > 0):
            raise ValueError(f"compute-optimal allocation needs {name} > 0, got {v}")


def _optimum(A, B, alpha, beta, C, kappa):
    """Closed-form (N*, D*) for arrays that broadcast against each other."""
    s = alpha + beta
    G = (alpha * A / (beta * B)) ** (1.0 / s)
    budget = C / kappa  # = N D
    N = G * budget ** (beta / s)
    return N, budget / N


def compute_optimal(params: LawParams, C, kappa: float = KAPPA) -> tuple[np.ndarray, np.ndarray]:
    """Compute-optimal (N*, D*) for training budget(s) ``C`` under C = kappa N D.

    Vectorised over ``C``; returns float64 arrays of C's shape (0-d for a scalar).
    """
    _check_params(params.A, params.B, params.alpha, params.beta)
    C = np.asarray(C, dtype=np.float64)
    if not np.all(C > 0):
        raise ValueError("compute budget C must be > 0")
    return _optimum(params.A, params.B, params.alpha, params.beta, C, float(kappa))


def optimal_loss(params: LawParams, C, kappa: float = KAPPA) -> np.ndarray:
    """Predicted loss at the compute-optimal point for budget(s) ``C``."""
    N, D = compute_optimal(params, C, kappa)
    return params.predict(N, D)


def _interval(values: np.ndarray, point, level: float) -> dict:
    q = 100.0 * np.array([(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    lo, hi = np.percentile(values, q, axis=0)
    return {"point": _out(point), "lo": _out(lo), "hi": _out(hi)}


def _out(x):
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def allocation_with_interval(
    samples: np.ndarray,
    C,
    kappa: float = KAPPA,
    level: float = 0.95,
    *,
    params: LawParams | None = None,
) -> dict:
    """Carry bootstrap parameter samples through the S3 optimum.

    ``samples`` is (n, 5) in ``law.NAMES`` order ([E, A, B, alpha, beta]), e.g.
    ``ScalingLaw.bootstrap(n).samples``. Every sample gives its own (N*, D*) and
    loss at that optimum for each budget in ``C``; the interval is the central
    ``level`` percentile range across samples. The point estimate comes from
    ``params`` (the fit on all data); without it, the sample median is used.
    Samples whose A, B, alpha or beta are not positive and finite (failed
    refits) are dropped and counted in ``n_valid``.

    Returns ``{"C", "kappa", "level", "n_samples", "n_valid", "N_opt", "D_opt",
    "tokens_per_param", "loss"}``, the last four each ``{"point", "lo", "hi"}``
    (floats for a scalar ``C``, arrays of C's shape otherwise).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    S = np.asarray(samples, dtype=np.float64)
    if S.ndim != 2 or S.shape[1] != 5:
        raise ValueError(f"samples must be (n, 5) [E, A, B, alpha, beta], got shape {S.shape}")
    C = np.asarray(C, dtype=np.float64)
    if not np.all(C > 0):
        raise ValueError("compute budget C must be > 0")
    valid = np.all(np.isfinite(S), axis=1) & np.all(S[:, 1:] > 0, axis=1)
    S = S[valid]
    if len(S) == 0:
        raise ValueError("no usable bootstrap sample (all have non-positive or non-finite terms)")

    col = (slice(None),) + (None,) * C.ndim  # (n, 1, ..., 1) against C's shape
    E, A, B, alpha, beta = (S[:, i][col] for i in range(5))
    N_s, D_s = _optimum(A, B, alpha, beta, C[None, ...], float(kappa))
    L_s = E + A * N_s ** (-alpha) + B * D_s ** (-beta)

    if params is not None:
        N_p, D_p = compute_optimal(params, C, kappa)
        L_p = params.predict(N_p, D_p)
    else:
        N_p, D_p, L_p = (np.median(x, axis=0) for x in (N_s, D_s, L_s))
    return {
        "C": _out(C),
        "kappa": float(kappa),
        "level": float(level),
        "n_samples": len(valid),
        "n_valid": int(valid.sum()),
        "N_opt": _interval(N_s, N_p, level),
        "D_opt": _interval(D_s, D_p, level),
        "tokens_per_param": _interval(D_s / N_s, np.asarray(D_p) / np.asarray(N_p), level),
        "loss": _interval(L_s, L_p, level),
    }


def _bounds(range_: Mapping, key: str) -> tuple[float, float] | None:
    """(min, max) for ``key`` from any of {"N": (lo, hi)}, {"N": {"min", "max"}},
    {"N_min", "N_max"} or {"min_N", "max_N"}; None when the range does not say."""
    v = range_.get(key)
    if isinstance(v, Mapping):
        return float(v["min"]), float(v["max"])
    if v is not None:
        lo, hi = v
        return float(lo), float(hi)
    for lo_k, hi_k in ((f"{key}_min", f"{key}_max"), (f"min_{key}", f"max_{key}")):
        if lo_k in range_ and hi_k in range_:
            return float(range_[lo_k]), float(range_[hi_k])
    return None


def extrapolation_warning(range_: Mapping, C=None, N=None, D=None) -> str | None:
    """One line naming each requested quantity outside the fitted range, and by what
    factor; None when everything asked for lies inside it.

    ``range_`` is the fit's ``range_`` (min/max of N, D, C and D/N over the sweep). With
    both N and D, their tokens per parameter D/N is judged too: a point inside the N, D
    and C ranges can still train far longer for its size than any fitted run. Array
    arguments are checked at their extremes.
    """
    ratio = None
    if N is not None and D is not None:
        ratio = np.asarray(D, dtype=np.float64) / np.asarray(N, dtype=np.float64)
    parts = []
    for key, val in (("C", C), ("N", N), ("D", D), ("D/N", ratio)):
        if val is None:
            continue
        b = _bounds(range_, key)
        if b is None:
            continue
        lo, hi = b
        v = np.asarray(val, dtype=np.float64)
        vmin, vmax = float(v.min()), float(v.max())
        rtol = 1e-9
        if vmax > hi * (1 + rtol):
            parts.append(f"{key}={vmax:.3g} is {vmax / hi:.3g}x above the fitted max {hi:.3g}")
        if vmin < lo * (1 - rtol):
            parts.append(f"{key}={vmin:.3g} is {lo / vmin:.3g}x below the fitted min {lo:.3g}")
    if not parts:
        return None
    return "extrapolation: " + "; ".join(parts) + " (the law was not fitted there)"


# --------------------------------------------------------------------------- S4


def inference_flops(N, tokens_per_request, inference_kappa: float = INFERENCE_KAPPA):
    """FLOPs of one request: inference_kappa N tokens_per_request (forward only).

    ``tokens_per_request`` counts every token the model processes for a request
    (prompt plus generated); batch size does not change the count.
    """
    return (
        inference_kappa
        * np.asarray(N, dtype=np.float64)
        * np.asarray(tokens_per_request, dtype=np.float64)
    )


@dataclass(frozen=True)
class LifecyclePlan:
    """A recommended (N, D) with what it costs over its life."""

    mode: str  # "budget" (minimise loss at fixed C_total) or "target" (minimise C_total)
    R: float  # future requests
    tokens_per_request: float
    N: float
    D: float
    C_train: float
    C_inference_total: float
    C_total: float
    loss: float

    @property
    def tokens_per_param(self) -> float:
        return self.D / self.N

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_param": self.tokens_per_param}


def _bisect_sign(fprime, lo: float, hi: float) -> float:
    """Root of an increasing function with fprime(lo) < 0 < fprime(hi)."""
    for _ in range(_MAX_BISECT):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if fprime(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


_NO_BRACKET = (
    "no lifecycle optimum found: the loss does not vary with N along the budget line "
    "(a degenerate fit, e.g. a huge alpha; fit more points over a wider range)"
)


def _lifecycle_target(p: LawParams, target: float, c_inf: float, kappa: float) -> float:
    """log N minimising C_total(N) = kappa N D(N) + c_inf N with D(N) reaching ``target``."""
    gap = target - p.E
    if not gap > 0:
        raise ValueError(
            f"target loss {target} is unreachable: it must exceed the irreducible loss "
            f"E={p.E} (E + A N^-alpha + B D^-beta > E for every finite N, D)"
        )
    x_min = (np.log(p.A) - np.log(gap)) / p.alpha  # below this, A N^-alpha >= gap

    def log_D(x):
        r = gap - p.A * np.exp(-p.alpha * x)  # what is left for the data term
        return (np.log(p.B) - np.log(r)) / p.beta, r

    def dC(x):  # d C_total / d log N; log C_total is convex, so one sign change
        lD, r = log_D(x)
        N = np.exp(x)
        return kappa * N * np.exp(lD) * (1.0 - p.alpha * p.A * N ** (-p.alpha) / (p.beta * r)) + (
            c_inf * N
        )

    lo = x_min + 1e-9 * max(1.0, abs(x_min))
    hi = x_min + 1.0
    for _ in range(_MAX_EXPAND):
        if dC(hi) > 0:
            break
        lo, hi = hi, hi + 2.0 * (hi - x_min)
    else:  # pragma: no cover - C_total grows linearly in N for large N
        raise ValueError(_NO_BRACKET)
    return _bisect_sign(dC, lo, hi)


def _lifecycle_budget(p: LawParams, budget: float, c_inf: float, kappa: float) -> float:
    """log N minimising loss subject to kappa N D + c_inf N = budget."""
    x_max = np.log(budget / c_inf) if c_inf > 0 else np.inf  # D = 0 at x_max

    def dL(x):  # d loss / d log N along the budget line; loss is convex in log N
        N = np.exp(x)
        C_train = budget - c_inf * N
        D = C_train / (kappa * N)
        return -p.alpha * p.A * N ** (-p.alpha) + p.beta * p.B * D ** (-p.beta) * budget / C_train

    # the R = 0 optimum is a good starting point; with R > 0 the answer lies below it
    x0 = float(np.log(_optimum(p.A, p.B, p.alpha, p.beta, budget, kappa)[0]))
    hi = min(x0 + 1.0, x_max - 1e-12 * max(1.0, abs(x_max))) if c_inf > 0 else x0 + 1.0
    for _ in range(_MAX_EXPAND):
        if dL(hi) > 0:
            break
        hi = hi + 1.0 if c_inf == 0 else hi + 0.5 * (x_max - hi)
    else:
        raise ValueError(_NO_BRACKET)
    lo = hi - 1.0
    for _ in range(_MAX_EXPAND):
        if dL(lo) < 0:
            break
        lo -= 2.0 * (hi - lo)
    else:
        raise ValueError(_NO_BRACKET)
    return _bisect_sign(dL, lo, hi)


def lifecycle_optimal(
    params: LawParams,
    *,
    requests: float,
    tokens_per_request: float,
    target_loss: float | None = None,
    budget: float | None = None,
    kappa: float = KAPPA,
    inference_kappa: float = INFERENCE_KAPPA,
) -> LifecyclePlan:
    """The (N, D) that is cheapest over training plus ``requests`` requests.

    Give exactly one of:

    * ``target_loss``: the (N, D) with predict(N, D) == target_loss minimising
      C_total. For each N the data term must supply the rest,
      D(N) = (B / (target - E - A N^-alpha))^(1/beta); the optimum satisfies
      alpha A N^-alpha = beta B D^-beta (1 + R inference_kappa tokens_per_request / (kappa D)).
      Raises ValueError when target_loss <= E (no N, D reach it).
    * ``budget``: the (N, D) minimising loss subject to C_total == budget, with
      D(N) = (budget - R C_inference(N)) / (kappa N); the optimum satisfies
      alpha A N^-alpha = beta B D^-beta budget / C_train.

    With ``requests == 0`` both reduce to the compute-optimal point (S3).
    """
    if (target_loss is None) == (budget is None):
        raise ValueError("give exactly one of target_loss= or budget=")
    _check_params(params.A, params.B, params.alpha, params.beta)
    R = float(requests)
    tpr = float(tokens_per_request)
    if R < 0 or tpr < 0:
        raise ValueError("requests and tokens_per_request must be >= 0")
    c_inf = R * float(inference_flops(1.0, tpr, inference_kappa))  # lifetime FLOPs per parameter

    if target_loss is not None:
        mode = "target"
        N = float(np.exp(_lifecycle_target(params, float(target_loss), c_inf, kappa)))
        r = float(target_loss) - params.E - params.A * N ** (-params.alpha)
        D = float((params.B / r) ** (1.0 / params.beta))
    else:
        mode = "budget"
        if not float(budget) > 0:
            raise ValueError("budget must be > 0")
        N = float(np.exp(_lifecycle_budget(params, float(budget), c_inf, kappa)))
        D = (float(budget) - c_inf * N) / (kappa * N)
    C_train = float(kappa * N * D)
    C_inf_total = float(c_inf * N)
    return LifecyclePlan(
        mode=mode,
        R=R,
        tokens_per_request=tpr,
        N=N,
        D=D,
        C_train=C_train,
        C_inference_total=C_inf_total,
        C_total=C_train + C_inf_total,
        loss=float(params.predict(N, D)),
    )


def lifecycle_intervals(
    samples: np.ndarray,
    rows: Sequence[Mapping],
    tokens_per_request: float,
    level: float = 0.95,
    **kwargs,
) -> list[dict]:
    """Bootstrap intervals of N, D, D/N and the loss for each lifecycle row: every valid
    sample's own lifecycle optimum at the row's R (``kwargs`` as ``lifecycle_optimal``:
    budget or target_loss, kappa, inference_kappa). A sample with no optimum (e.g. its
    E above a target) is left out of that row's interval and counted."""
    S = np.asarray(samples, dtype=np.float64)
    valid = np.all(np.isfinite(S), axis=1) & np.all(S[:, 1:] > 0, axis=1)
    tail = 50.0 * (1.0 - level)
    out = []
    for row in rows:
        got = []
        for sample in S[valid]:
            try:
                plan = lifecycle_optimal(
                    LawParams.from_array(sample),
                    requests=row["R"],
                    tokens_per_request=tokens_per_request,
                    **kwargs,
                )
            except ValueError:
                continue
            if plan.D > 0:
                got.append((plan.N, plan.D, plan.tokens_per_param, plan.loss))
        entry: dict = {"level": level, "n_valid": len(got)}
        if got:
            arr = np.array(got)
            lo, hi = np.percentile(arr, [tail, 100.0 - tail], axis=0)
            for i, key in enumerate(("N", "D", "tokens_per_param", "loss")):
                entry[key] = [float(lo[i]), float(hi[i])]
        out.append(entry)
    return out


TABLE_COLUMNS = (
    "R",
    "N",
    "D",
    "tokens_per_param",
    "C_train",
    "C_inference_total",
    "C_total",
    "loss",
)


def lifecycle_table(
    params: LawParams,
    requests_list: Sequence[float],
    tokens_per_request: float,
    target_loss: float | None = None,
    budget: float | None = None,
    kappa: float = KAPPA,
    inference_kappa: float = INFERENCE_KAPPA,
) -> list[dict]:
    """One row per R (keys ``TABLE_COLUMNS``): how the recommendation moves with R."""
    rows = []
    for R in requests_list:
        plan = lifecycle_optimal(
            params,
            requests=R,
            tokens_per_request=tokens_per_request,
            target_loss=target_loss,
            budget=budget,
            kappa=kappa,
            inference_kappa=inference_kappa,
        )
        d = plan.to_dict()
        rows.append({k: d[k] for k in TABLE_COLUMNS})
    return rows
