"""Requirement L2: token mean vs sequence mean, reduced from any per-target loss."""

import math

import pytest
import torch

from ledgerlm.train.loss import (
    NoTargetsError,
    objective_denominator,
    objective_loss,
    objective_terms,
    per_target_loss,
)

# P4 batch: A=aaa, B=bcbc, vocab a,b,c -> 0,1,2, T=4.
P4_LABELS = torch.tensor([[0, 0, -100], [2, 1, 2]])


def _p4_per_target(theta: torch.Tensor) -> torch.Tensor:
    """Every position's logits are [theta, 0, 0]."""
    zero = torch.zeros((), dtype=theta.dtype)
    logits = torch.stack([theta, zero, zero]).expand(2, 3, 3)
    return per_target_loss(logits, P4_LABELS.clamp(min=0))


def _p4_step(objective: str) -> tuple[float, float, float]:
    theta = torch.tensor(math.log(18 / 11), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=0.2)
    loss = objective_loss(_p4_per_target(theta), P4_LABELS != -100, objective, "exclude")
    loss.backward()
    grad = float(theta.grad)
    opt.step()
    return loss.item(), grad, theta.item()


def test_seed_l2_p4_token_mean():
    loss, grad, theta = _p4_step("token_mean")
    assert loss == pytest.approx(1.0939935873, abs=1e-9)
    assert grad == pytest.approx(0.05, abs=1e-12)
    assert theta == pytest.approx(0.4824764851, abs=1e-9)


def test_seed_l2_p4_sequence_mean():
    loss, grad, theta = _p4_step("sequence_mean")
    assert loss == pytest.approx(1.0447459388, abs=1e-9)
    assert grad == pytest.approx(-0.05, abs=1e-12)
    assert theta == pytest.approx(0.5024764851, abs=1e-9)


def test_token_mean_objective_matches_torch_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 3))
    mask = torch.tensor([[True, False, True], [True, True, False]])
    expected = torch.nn.functional.cross_entropy(logits[mask], targets[mask])
    got = objective_loss(per_target_loss(logits, targets), mask, "token_mean", "exclude")
    torch.testing.assert_close(got, expected)


def _quadratic_step(objective: str) -> tuple[float, float, float]:
    """Row A: 2 targets of 0.5(1.5t+0.5)^2; row B: 6 of 0.5(3-2t)^2; t = 1."""
    theta = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    a = 0.5 * (1.5 * theta + 0.5) ** 2
    b = 0.5 * (3 - 2 * theta) ** 2
    junk = torch.tensor(1e6, dtype=torch.float64)  # unsupervised slots must not count
    per_target = torch.stack([torch.stack([a, a, junk, junk, junk, junk]), torch.stack([b] * 6)])
    mask = torch.tensor([[True, True, False, False, False, False], [True] * 6])
    opt = torch.optim.SGD([theta], lr=0.1)
    loss = objective_loss(per_target, mask, objective, "exclude")
    loss.backward()
    grad = float(theta.grad)
    opt.step()
    return loss.item(), grad, theta.item()


def test_seed_l2_quadratic_token_mean():
    loss, grad, theta = _quadratic_step("token_mean")
    assert (loss, grad, theta) == pytest.approx((0.875, -0.75, 1.075), abs=1e-12)


def test_seed_l2_quadratic_sequence_mean():
    loss, grad, theta = _quadratic_step("sequence_mean")
    assert (loss, grad, theta) == pytest.approx((1.25, 0.5, 0.95), abs=1e-12)


def test_terms_are_numerator_and_denominator():
    per_target = torch.tensor([[1.0, 3.0, 0.0], [2.0, 2.0, 8.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    num, den = objective_terms(per_target, mask, "token_mean", "exclude")
    assert (float(num), den) == (16.0, 5)
    num, den = objective_terms(per_target, mask, "sequence_mean", "exclude")
    assert (float(num), den) == (2.0 + 4.0, 2)
    num, den = objective_terms(per_target, mask, "sequence_mean", "zero")
    assert (float(num), den) == (6.0, 3)


def test_empty_row_policies_differ_only_when_a_row_is_empty():
    per_target = torch.tensor([[1.0, 3.0], [4.0, 9.0]])
    full = torch.tensor([[True, True], [True, False]])
    exclude = objective_loss(per_target, full, "sequence_mean", "exclude")
    zero = objective_loss(per_target, full, "sequence_mean", "zero")
    assert float(exclude) == float(zero) == 3.0
    one_empty = torch.tensor([[True, True], [False, False]])
    assert float(objective_loss(per_target, one_empty, "sequence_mean", "exclude")) == 2.0
    assert float(objective_loss(per_target, one_empty, "sequence_mean", "zero")) == 1.0
    # token mean has no notion of rows: the policy is irrelevant
    assert objective_denominator(one_empty, "token_mean", "zero") == 2


def test_non_finite_values_at_unsupervised_positions_do_not_leak():
    theta = torch.tensor(2.0, requires_grad=True)
    per_target = torch.stack([theta, torch.tensor(math.inf), torch.tensor(math.nan)])[None]
    mask = torch.tensor([[True, False, False]])
    loss = objective_loss(per_target, mask, "sequence_mean", "zero")
    loss.backward()
    assert loss.item() == 2.0 and theta.grad.item() == 1.0


@pytest.mark.parametrize("objective", ["token_mean", "sequence_mean"])
@pytest.mark.parametrize("empty_rows", ["exclude", "zero"])
def test_batch_without_targets_raises(objective, empty_rows):
    mask = torch.zeros(2, 3, dtype=torch.bool)
    num, den = objective_terms(torch.ones(2, 3), mask, objective, empty_rows)
    assert float(num) == 0.0  # a micro-batch may be empty; the step decides
    assert den == (2 if (objective, empty_rows) == ("sequence_mean", "zero") else 0)
    with pytest.raises(NoTargetsError):
        objective_loss(torch.ones(2, 3), mask, objective, empty_rows)


def test_unknown_objective_is_an_error():
    with pytest.raises(ValueError, match="objective"):
        objective_terms(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), "median", "zero")
    with pytest.raises(ValueError, match="empty_rows"):
        objective_denominator(torch.ones(1, 2, dtype=torch.bool), "sequence_mean", "drop")
