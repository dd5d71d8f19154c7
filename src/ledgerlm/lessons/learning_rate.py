"""The learning-rate lesson: gradient descent on a quadratic with a good and a too-large
rate (requirements L2, E)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ledgerlm.lessons.checks import Checks, Expected, LessonResult, fmt

# The quadratic example of requirement L2: row B's loss (3 - 2 theta)^2 / 2 from theta = 1, SGD with
# eta = 0.1. Its curvature is 2^2 = 4, so gradient descent contracts the distance to
# the optimum theta* = 1.5 by 1 - 4 eta per step and is stable only for
# 0 < eta < 2/4 = 0.5 (requirements E: a good and a too-large learning rate):
# eta = 0.1 contracts by 0.6, eta = 0.6 expands by -1.4, eta = 0.5 oscillates (-1).
LR_ROW = 6  # row B's six identical targets
LR_STEPS = 20
LR_RATES = {"good": 0.1, "large": 0.6, "edge": 0.5}
LEARNING_RATE = {
    "optimum": Fraction(3, 2),
    "curvature": 4,
    "stability_bound": Fraction(1, 2),
    "first_step": Fraction(6, 5),  # 1 - 0.1 * (-2)
    "good_factor": Fraction(3, 5),
    "large_factor": Fraction(-7, 5),
    "edge_factor": -1,
    "converged_within": 1e-3,  # this lesson's thresholds for "converged" / "diverged"
    "diverged_beyond": 10.0,
}


def _row_b_objective(theta: Any) -> Any:
    import torch

    from ledgerlm.train.loss import objective_loss

    per_target = (0.5 * (3 - 2 * theta) ** 2).expand(1, LR_ROW)
    return objective_loss(per_target, torch.ones(1, LR_ROW, dtype=torch.bool), "token_mean", "zero")


def _descend(lr: float, steps: int) -> list[float]:
    """theta after each of ``steps`` SGD updates, the rate read from the project's
    schedule (constant, no warmup) at every step."""
    import torch

    from ledgerlm.config import TrainConfig
    from ledgerlm.train.optim import lr_at

    cfg = TrainConfig(lr=lr, schedule="constant", warmup_steps=0, max_steps=steps)
    theta = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=lr)
    path = [theta.item()]
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad()
        _row_b_objective(theta).backward()
        opt.step()
        path.append(theta.item())
    return path


def learning_rate(expected: Expected | None = None) -> LessonResult:
    """One-dimensional gradient descent on requirement L2's quadratic with a good and a too-large
    learning rate: convergence, divergence, and the bound 2 / curvature between them."""
    import torch

    checks = Checks(LEARNING_RATE, expected)
    theta = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(_row_b_objective(theta), theta, create_graph=True)
    (curvature,) = torch.autograd.grad(grad, theta)
    curvature_v = float(curvature)
    bound = 2 / curvature_v
    # the optimum: where a Newton step from theta lands (exact for a quadratic)
    optimum = 1.0 - float(grad.detach()) / curvature_v
    runs = {key: _descend(lr, LR_STEPS) for key, lr in LR_RATES.items()}
    values: dict[str, Any] = {
        "curvature": curvature_v,
        "stability_bound": bound,
        "optimum": optimum,
        "gradient_at_start": float(grad.detach()),
    }
    for key, path in runs.items():
        values[f"{key}_path"] = path
        values[f"{key}_factor"] = (path[2] - optimum) / (path[1] - optimum)
        values[f"{key}_distance"] = abs(path[-1] - optimum)
    good, large, edge = LR_RATES["good"], LR_RATES["large"], LR_RATES["edge"]
    lines = [
        f"objective: row B of the quadratic example, {LR_ROW} targets of (3 - 2 theta)^2 / 2, "
        f"token mean; theta starts at 1; SGD at the schedule's rate (constant), {LR_STEPS} steps",
        checks.equal("curvature", "curvature (second derivative, autograd)", curvature_v).line(),
        checks.equal("optimum", "optimum theta*", optimum).line(),
        checks.equal("stability_bound", "stable for lr below 2 / curvature", bound).line(),
        checks.equal("first_step", f"theta after one step at lr {fmt(good)}",
                     runs["good"][1]).line(),
        checks.equal("good_factor", f"lr {fmt(good)}: distance to theta* scales per step by",
                     values["good_factor"]).line(),
        checks.below("converged_within", f"lr {fmt(good)}: |theta - theta*| after "
                     f"{LR_STEPS} steps", values["good_distance"]).line(),
        checks.equal("large_factor", f"lr {fmt(large)}: distance to theta* scales per step by",
                     values["large_factor"]).line(),
        checks.above("diverged_beyond", f"lr {fmt(large)}: |theta - theta*| after "
                     f"{LR_STEPS} steps", values["large_distance"]).line(),
        checks.equal("edge_factor", f"lr {fmt(edge)} (the bound): oscillates, "
                     "factor", values["edge_factor"]).line(),
        f"-> below 2 / curvature the loss falls; above it every step overshoots further "
        f"(theta after {LR_STEPS} steps: {fmt(runs['good'][-1])} vs {fmt(runs['large'][-1])})",
    ]  # fmt: skip
    return LessonResult(
        "learning-rate",
        "A good and a too-large learning rate on a quadratic",
        "requirements L2, E",
        lines,
        checks.items,
        values,
    )
