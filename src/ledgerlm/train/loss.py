"""Next-token cross-entropy and the two training objectives, with explicit denominators.

The loss of an optimizer step is (sum of numerators over every micro-batch) /
(sum of denominators). Functions here return the numerator and the denominator
separately so the caller owns the denominator of the whole step: the result is
then the same whatever the micro-batch split.

Objectives (any per-target loss, not only cross-entropy):

- ``token_mean``: numerator = sum of supervised losses, denominator = their count.
- ``sequence_mean``: numerator = sum over rows of (row loss sum / row target count);
  the denominator counts the rows with targets (``empty_rows="exclude"``) or every
  row, a row without targets adding 0 to the numerator (``empty_rows="zero"``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

OBJECTIVES = ("token_mean", "sequence_mean")
EMPTY_ROW_POLICIES = ("exclude", "zero")


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Low-precision logits are scored in fp32; fp32 and fp64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class NoTargetsError(ValueError):
    """A batch with no supervised target has no defined loss."""


def per_target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Unreduced -log p(target) of shape targets.shape (for per-domain evaluation)."""
    v = logits.shape[-1]
    return F.cross_entropy(
        _upcast(logits.reshape(-1, v)), targets.reshape(-1), reduction="none"
    ).view(targets.shape)


def _check(objective: str, empty_rows: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} ({' | '.join(OBJECTIVES)})")
    if empty_rows not in EMPTY_ROW_POLICIES:
        raise ValueError(f"unknown empty_rows {empty_rows!r} ({' | '.join(EMPTY_ROW_POLICIES)})")


def objective_denominator(
    loss_mask: torch.Tensor | np.ndarray, objective: str, empty_rows: str
) -> int:
    """The denominator needs only the label mask, so a step knows it before any forward
    (from the host batch's mask as a numpy array: no device round trip)."""
    _check(objective, empty_rows)
    mask = loss_mask.astype(bool) if isinstance(loss_mask, np.ndarray) else loss_mask.bool()
    if objective == "token_mean":
        return int(mask.sum())
    rows = mask.reshape(-1, mask.shape[-1])
    return int(rows.any(-1).sum()) if empty_rows == "exclude" else rows.shape[0]


def objective_terms(
    per_target: torch.Tensor, loss_mask: torch.Tensor, objective: str, empty_rows: str
) -> tuple[torch.Tensor, int]:
    """(numerator, denominator) of one micro-batch; rows are the last axis of (..., T).

    Unsupervised positions are selected out (not multiplied by 0), so an inf or
    NaN there cannot leak into the numerator.
    """
    denominator = objective_denominator(loss_mask, objective, empty_rows)
    mask = loss_mask.bool()
    losses = torch.where(mask, per_target, torch.zeros((), dtype=per_target.dtype))
    if objective == "token_mean":
        return losses.sum(), denominator
    row_sum = losses.reshape(-1, losses.shape[-1]).sum(-1)
    row_count = mask.reshape(-1, mask.shape[-1]).sum(-1).clamp(min=1)
    return (row_sum / row_count).sum(), denominator


def objective_weights(
    loss_mask: torch.Tensor, objective: str, empty_rows: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Each target's weight in the numerator, shape loss_mask.shape: ``sum(weights *
    per_target)`` is ``objective_terms``'s numerator (up to rounding). 1 at each supervised
    target (``token_mean``) or 1 / the row's supervised targets (``sequence_mean``); 0 at
    every unsupervised position. Known before any forward, so the model can score the
    head chunk by chunk (``GPT.forward(..., targets=, weights=)``)."""
    _check(objective, empty_rows)
    mask = loss_mask.bool()
    weights = mask.to(dtype)
    if objective == "token_mean":
        return weights
    return weights / mask.sum(-1, keepdim=True).clamp(min=1).to(dtype)


def objective_loss(
    per_target: torch.Tensor, loss_mask: torch.Tensor, objective: str, empty_rows: str
) -> torch.Tensor:
    """The objective of one batch taken alone (numerator / denominator).

    A batch without any supervised target is an error under every policy: even
    with ``empty_rows="zero"`` its loss would be a meaningless 0.
    """
    numerator, denominator = objective_terms(per_target, loss_mask, objective, empty_rows)
    if not bool(loss_mask.any()):
        raise NoTargetsError(f"{objective}: batch has no supervised targets")
    return numerator / denominator
