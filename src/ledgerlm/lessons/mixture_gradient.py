"""The mixture-gradient lesson: one squared-error objective under two domain mixtures
(requirements D8, E)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ledgerlm.lessons.checks import Checks, Expected, LessonResult, fmt
from ledgerlm.lessons.squared_error import gradient_at

# The mixture of this lesson: pools of 80, 15 and 5 (1e8 tokens) of web, code and math;
# sampling tokens uniformly gives 80%/15%/5%, the math-heavy mixture 50%/30%/20%; with
# D = 10e9 tokens math is seen 4 times, code 2 times, web 0.625 times (section 2.1.1).
# Requirements E ask for the gradient of a squared error under two mixtures. The
# per-domain targets are this lesson's own setting (web 0, code 1, math 4), so the
# optimum c* = sum p_i y_i is 0.8*0 + 0.15*1 + 0.05*4 = 0.35 under the natural mixture
# and 0.5*0 + 0.3*1 + 0.2*4 = 1.1 under the math-heavy one; each objective's gradient
# c - c* is +0.75 at the other's optimum (1.1 - 0.35) and -0.75 the other way round.
MIX_POOLS = {"web": int(80e8), "code": int(15e8), "math": int(5e8)}
MIX_BUDGET = int(100e8)
MIX_HEAVY = {"web": 0.5, "code": 0.3, "math": 0.2}
MIX_TARGETS = {"web": 0.0, "code": 1.0, "math": 4.0}
MIX_BATCH = 100  # supervised targets per batch, drawn at the mixture's shares
MIXTURE_GRADIENT = {
    "natural_counts": [80, 15, 5],  # web, code, math targets of 100
    "heavy_counts": [50, 30, 20],
    "heavy_exposure": [0.625, 2, 4],
    "natural_optimum": 0.35,
    "heavy_optimum": 1.1,
    "natural_gradient_at_natural_optimum": Fraction(0),
    "heavy_gradient_at_heavy_optimum": Fraction(0),
    "natural_gradient_at_heavy_optimum": Fraction(3, 4),
    "heavy_gradient_at_natural_optimum": Fraction(-3, 4),
}


def mixture_gradient(expected: Expected | None = None) -> LessonResult:
    """The gradient of a squared-error objective under the natural mixture (80/15/5) and a
    math-heavy one (50/30/20): the same prediction gets opposite pushes, and the
    optimum moves with the mixture."""
    from ledgerlm.data.budget import weighted_mean
    from ledgerlm.mixture.plan import plan_mixture

    checks = Checks(MIXTURE_GRADIENT, expected)
    domains = list(MIX_POOLS)
    total = sum(MIX_POOLS.values())
    natural = {d: MIX_POOLS[d] / total for d in domains}  # uniform over tokens
    mixtures = {"natural": natural, "heavy": MIX_HEAVY}
    values: dict[str, Any] = {"domains": domains, "targets": [MIX_TARGETS[d] for d in domains]}
    batches: dict[str, list[float]] = {}
    optimum: dict[str, float] = {}
    for key, weights in mixtures.items():
        plan = {p.domain: p for p in plan_mixture(MIX_POOLS, weights, MIX_BATCH).domains}
        counts = [plan[d].expected_tokens for d in domains]
        values[f"{key}_weights"] = [plan[d].weight for d in domains]
        values[f"{key}_counts"] = counts
        batches[key] = [MIX_TARGETS[d] for d, n in zip(domains, counts, strict=True)
                        for _ in range(round(n))]  # fmt: skip
        optimum[key] = weighted_mean(values["targets"], [weights[d] for d in domains])
        values[f"{key}_optimum"] = optimum[key]
        budget = {p.domain: p for p in plan_mixture(MIX_POOLS, weights, MIX_BUDGET).domains}
        values[f"{key}_exposure"] = [budget[d].exposure for d in domains]
    grads = {
        f"{obj}_gradient_at_{at}_optimum": gradient_at(optimum[at], batches[obj])
        for obj in mixtures
        for at in mixtures
    }
    values.update(grads)

    def grad_line(obj: str, at: str) -> str:
        key = f"{obj}_gradient_at_{at}_optimum"
        return checks.equal(key, f"gradient of the {obj} objective at c = {fmt(optimum[at])}",
                            grads[key]).line()  # fmt: skip

    lines = [
        f"pools web/code/math {', '.join(f'{MIX_POOLS[d]:.2g}' for d in domains)} tokens; "
        f"per-domain targets {fmt(values['targets'])}; loss (c - y)^2 / 2, token mean",
        checks.equal("natural_counts", "targets of 100 at the natural shares",
                     values["natural_counts"]).line(),
        checks.equal("heavy_counts", "targets of 100 at the math-heavy shares",
                     values["heavy_counts"]).line(),
        checks.equal("heavy_exposure", f"math-heavy exposure over D = {MIX_BUDGET:.0e} tokens",
                     values["heavy_exposure"]).line(),
        checks.equal("natural_optimum", "squared-error optimum, natural mixture",
                     optimum["natural"]).line(),
        checks.equal("heavy_optimum", "squared-error optimum, math-heavy mixture",
                     optimum["heavy"]).line(),
        grad_line("natural", "natural"),
        grad_line("heavy", "heavy"),
        grad_line("natural", "heavy"),
        grad_line("heavy", "natural"),
        f"-> reweighting the domains moves the optimum from {fmt(optimum['natural'])} to "
        f"{fmt(optimum['heavy'])}: where one mixture is at rest the other still pushes",
    ]  # fmt: skip
    return LessonResult(
        "mixture-gradient",
        "A domain mixture changes the gradient and moves the optimum",
        "requirements D8, E",
        lines,
        checks.items,
        values,
    )
