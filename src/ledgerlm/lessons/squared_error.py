"""The squared-error objective of a constant prediction, and its gradient by autograd,
shared by the dedup-target and mixture-gradient lessons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def squared_error_objective(c: Any, targets: Sequence[float]) -> Any:
    """The token-mean objective (``train.loss.objective_loss``) of a constant
    prediction ``c`` under the per-target squared error (c - y)^2 / 2, one row."""
    import torch

    from ledgerlm.train.loss import objective_loss

    y = torch.as_tensor(list(targets), dtype=torch.float64)[None]  # (1, T)
    per_target = 0.5 * (c - y) ** 2
    return objective_loss(per_target, torch.ones_like(y, dtype=torch.bool), "token_mean", "zero")


def gradient_at(c: float, targets: Sequence[float]) -> float:
    """d objective / d c by autograd, at the constant prediction ``c``."""
    import torch

    theta = torch.tensor(float(c), dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(squared_error_objective(theta, targets), theta)
    return float(grad)
