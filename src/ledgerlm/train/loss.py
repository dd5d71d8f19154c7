"""Next-token cross-entropy with an explicit denominator.

The loss of an optimizer step is (sum of per-target losses over every
micro-batch) / (number of supervised targets in the whole step). Functions here
return the sum and the count separately so the caller owns the denominator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Low-precision logits are scored in fp32; fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class NoTargetsError(ValueError):
    """A batch with no supervised target has no defined loss."""


def cross_entropy_sum(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """Sum of -log p(target) over supervised positions, computed via log-sum-exp.

    logits (..., V), targets and loss_mask (...). Only supervised rows are
    gathered before the softmax, so padding costs no vocabulary-sized work.
    """
    sel = loss_mask.reshape(-1)
    count = int(sel.sum())
    if count == 0:
        raise NoTargetsError("batch has no supervised targets")
    flat = _upcast(logits.reshape(-1, logits.shape[-1])[sel])
    return F.cross_entropy(flat, targets.reshape(-1)[sel], reduction="sum"), count


def per_target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Unreduced -log p(target) of shape targets.shape (for per-domain evaluation)."""
    v = logits.shape[-1]
    return F.cross_entropy(
        _upcast(logits.reshape(-1, v)), targets.reshape(-1), reduction="none"
    ).view(targets.shape)


def token_mean_loss(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor):
    total, count = cross_entropy_sum(logits, targets, loss_mask)
    return total / count
