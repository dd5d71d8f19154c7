"""Seed 003, sections 4.1.1, 4.1.2, 5.2.1 and 5.5: the worked numbers of the loss and the
update not asserted elsewhere, through the project's loss and optimizer functions.

Already asserted (not repeated here): 1.3863 and [0.5, 0.25, -0.75], 1.3133, AdamW 0.989
(tests/train/test_loss_optim.py); L_token/L_seq, g = +-0.05 and the SGD thetas, the
quadratic 0.875/1.25 example (tests/train/test_objectives.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from ledgerlm.config import TrainConfig
from ledgerlm.train.loss import objective_loss, objective_weights, per_target_loss
from ledgerlm.train.optim import build_optimizer

# Seed 003, 1.1.1 / 4.1.2: A = aaa, B = bcbc (a, b, c -> 0, 1, 2), T = 4: labels
# [[0, 0, PAD], [2, 1, 2]], five supervised targets.
P4_TARGETS = torch.tensor([[0, 0, 0], [2, 1, 2]])
P4_MASK = torch.tensor([[True, True, False], [True, True, True]])


def token_mean_loss(logits, targets, loss_mask):
    """The token-mean objective the trainer reduces its per-target losses with."""
    return objective_loss(per_target_loss(logits, targets), loss_mask, "token_mean", "exclude")


def test_one_sgd_step_on_the_logits():
    # 4.1.1: z = [log 2, 0, 0], target the third; SGD with lr 0.1 on the logits themselves
    z = torch.tensor([[math.log(2), 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([z], lr=0.1)
    token_mean_loss(z, torch.tensor([2]), torch.tensor([True])).backward()
    opt.step()
    assert z[0].tolist() == pytest.approx([math.log(2) - 0.05, -0.025, 0.075], abs=1e-12)


def _p4_per_target(theta: torch.Tensor) -> torch.Tensor:
    """Every position outputs z = [theta, 0, 0] (4.1.2's one shared scalar)."""
    zero = torch.zeros((), dtype=theta.dtype)
    logits = torch.stack([theta, zero, zero]).expand(2, 3, 3)
    return per_target_loss(logits, P4_TARGETS)


def test_per_target_values_and_derivatives_at_theta_0():
    # theta0 = ln(18/11): p = [0.45, 0.275, 0.275]
    theta = torch.tensor(math.log(18 / 11), dtype=torch.float64, requires_grad=True)
    per_target = _p4_per_target(theta)
    supervised = per_target[P4_MASK]  # A0, A1, B0, B1, B2
    assert supervised.tolist() == pytest.approx(
        [0.7985076962, 0.7985076962, 1.2909841813, 1.2909841813, 1.2909841813], abs=1e-10
    )
    derivatives = [
        torch.autograd.grad(loss, theta, retain_graph=True)[0].item() for loss in supervised
    ]
    assert derivatives == pytest.approx([-0.55, -0.55, 0.45, 0.45, 0.45], abs=1e-12)
    weights = objective_weights(P4_MASK, "token_mean", "exclude")
    assert weights[0, 2].item() == 0.0  # A2's padding label contributes nothing


@pytest.mark.parametrize(
    ("target", "gradient"),
    [(0, [-0.55, 0.275, 0.275]), (2, [0.45, 0.275, -0.725]), (1, [0.45, -0.725, 0.275])],
)
def test_full_logit_gradient_of_one_target(target, gradient):
    # 4.1.2: A0 (target 0), B0 (target 2), B1 (target 1) at p = [0.45, 0.275, 0.275]
    z = torch.tensor([[math.log(18 / 11), 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    token_mean_loss(z, torch.tensor([target]), torch.tensor([True])).backward()
    assert z.grad[0].tolist() == pytest.approx(gradient, abs=1e-12)


def _target_weights(mask: torch.Tensor, objective: str) -> torch.Tensor:
    """The weight each per-target loss carries in the objective: d objective / d loss_t."""
    per_target = torch.ones(mask.shape, dtype=torch.float64, requires_grad=True)
    (weights,) = torch.autograd.grad(objective_loss(per_target, mask, objective, "exclude"),
                                     per_target)  # fmt: skip
    return weights


def test_per_target_weights_of_the_p4_batch():
    # 5.5: each A target weighs 1/5 vs 1/4, each B target 1/5 vs 1/6; "target 0" (A's two)
    # 2/5 = 0.4 under the token mean, 0.5 under the sequence mean, with p0 = 0.45 between
    token = _target_weights(P4_MASK, "token_mean")
    seq = _target_weights(P4_MASK, "sequence_mean")
    assert token[P4_MASK].tolist() == pytest.approx([1 / 5] * 5, abs=1e-15)
    assert seq[P4_MASK].tolist() == pytest.approx([1 / 4, 1 / 4, 1 / 6, 1 / 6, 1 / 6], abs=1e-15)
    assert token[0, 2] == seq[0, 2] == 0  # the padding slot weighs nothing
    zero = P4_MASK & (P4_TARGETS == 0)
    assert (token[zero].sum().item(), seq[zero].sum().item()) == pytest.approx((0.4, 0.5))
    p0 = torch.softmax(torch.tensor([math.log(18 / 11), 0.0, 0.0]), -1)[0].item()
    assert p0 == pytest.approx(0.45) and 0.4 < p0 < 0.5


def test_per_target_weights_of_2_and_6_targets():
    # 5.5, figure 19: 2 short-sample targets and 6 long-sample ones
    mask = torch.tensor([[True] * 2 + [False] * 4, [True] * 6])
    token = _target_weights(mask, "token_mean")
    seq = _target_weights(mask, "sequence_mean")
    assert token[mask].tolist() == pytest.approx([1 / 8] * 8, abs=1e-15)
    assert seq[mask].tolist() == pytest.approx([1 / 4] * 2 + [1 / 12] * 6, abs=1e-15)
    assert token.sum().item() == pytest.approx(1) and seq.sum().item() == pytest.approx(1)


def _adamw_first_step(g: float, weight_decay: float = 0.1):
    layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    cfg = TrainConfig(lr=0.01, weight_decay=weight_decay, betas=(0.9, 0.999))
    opt = build_optimizer(layer, cfg)
    layer.weight.grad = torch.full_like(layer.weight, g)
    opt.step()
    return layer.weight.item(), opt.state[layer.weight], cfg


def test_adamw_first_step_intermediates():
    # 5.2.1: theta = 1, g = 0.2, zero statistics, beta1 = 0.9, beta2 = 0.999: bias-corrected
    # m-hat = 0.2 and v-hat = 0.04
    _, state, cfg = _adamw_first_step(0.2)
    step = int(state["step"])
    beta1, beta2 = cfg.betas
    assert step == 1
    assert state["exp_avg"].item() == pytest.approx(0.1 * 0.2, rel=1e-6)
    assert state["exp_avg_sq"].item() == pytest.approx(0.001 * 0.04, rel=1e-6)
    m_hat = state["exp_avg"].item() / (1 - beta1**step)
    v_hat = state["exp_avg_sq"].item() / (1 - beta2**step)
    assert (m_hat, v_hat) == pytest.approx((0.2, 0.04), rel=1e-6)


def test_adamw_first_step_is_decay_0_999_minus_adaptive_0_01():
    # 5.2.1: 0.989 = 0.999 - 0.01: the decoupled decay alone (no gradient) gives
    # (1 - 0.01 x 0.1) x 1 = 0.999, the adaptive step alone (no decay) 1 - 0.01 x 0.2 / 0.2
    decay_only, _, _ = _adamw_first_step(0.0)
    adaptive_only, _, _ = _adamw_first_step(0.2, weight_decay=0.0)
    assert decay_only == pytest.approx(0.999, abs=1e-7)
    assert adaptive_only == pytest.approx(0.99, abs=1e-6)


def test_adamw_first_step_does_not_grow_tenfold_with_the_gradient():
    # 5.2.1: "更新幅度不会随梯度乘以 10 而直接乘以 10": g = 2 moves it as far as g = 0.2
    tenfold, _, _ = _adamw_first_step(2.0)
    assert tenfold == pytest.approx(0.989, abs=1e-6)
