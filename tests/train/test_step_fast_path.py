"""The training step's fast path computes the numbers of the plain one.

A step gives the model its targets and each target's weight in the objective
(``objective_weights``); the model scores its head in chunks (``GPT.forward(...,
targets=, weights=)``) instead of returning the (B, T, V) logits for the loss to gather.
The optimizer is the fused CPU AdamW. Losses and gradients agree with the plain path
(full logits, gathered supervised rows, ``objective_terms``) to rounding.
"""

import copy

import numpy as np
import pytest
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import Trainer
from ledgerlm.train.loss import objective_terms, objective_weights, per_target_loss
from ledgerlm.train.optim import build_optimizer, param_groups

V = 60
ROWS, SEQ = 4, 48
OBJECTIVES = [("token_mean", "exclude"), ("sequence_mean", "exclude"), ("sequence_mean", "zero")]


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = [(rng.integers(3, V, size=rng.integers(2, 40)), 0) for _ in range(30)]
    rows = list(pack_documents(docs, SEQ + 1, 1, 2, 0))[:ROWS]
    return next(batches(rows, ROWS))


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(d_model=32, n_layers=2, n_heads=2), V)


@pytest.mark.parametrize(("objective", "empty_rows"), OBJECTIVES)
def test_objective_weights_give_the_numerator(objective, empty_rows):
    b = _batch(1)
    b.loss_mask[1] = False  # a row without targets
    per_target = torch.rand(b.loss_mask.shape, dtype=torch.float64)
    per_target[~b.loss_mask] = float("nan")  # never read
    weights = objective_weights(b.loss_mask, objective, empty_rows, torch.float64)
    numerator, _ = objective_terms(per_target, b.loss_mask, objective, empty_rows)
    weighted = (per_target.nan_to_num() * weights).sum()
    assert float(weighted) == pytest.approx(float(numerator), rel=1e-14)
    assert not weights[~b.loss_mask].any()


@pytest.mark.parametrize(("objective", "empty_rows"), OBJECTIVES)
def test_a_step_has_the_plain_paths_loss_and_gradients(objective, empty_rows):
    """The trainer's step against the plain computation (the bool mask, full logits, the
    per-target losses, the same denominator and clipping), in fp64."""
    b = _batch(2)
    cfg = TrainConfig(
        max_steps=1,
        micro_batch_rows=ROWS,
        warmup_steps=0,
        grad_clip=0.5,
        objective=objective,
        empty_rows=empty_rows,
    )
    model = _model().double()
    plain = copy.deepcopy(model)
    trainer = Trainer(model, build_optimizer(model, cfg), cfg, iter([b]), "isolated")
    loss = trainer.train_step()

    logits = plain(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
    per_target = per_target_loss(logits, b.targets)
    numerator, denominator = objective_terms(per_target, b.loss_mask, objective, empty_rows)
    (numerator / denominator).backward()
    norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.grad_clip)
    assert (~b.loss_mask).any()
    assert loss == pytest.approx(float(numerator.detach()) / denominator, rel=1e-13)
    assert trainer.state.grad_norm == pytest.approx(float(norm), rel=1e-12)
    for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
        assert (p.grad - q.grad).abs().max() <= 1e-12 * q.grad.abs().max(), name


def test_adamw_is_fused_on_the_cpu_and_agrees_with_the_loop():
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)
    model = _model()
    fused = build_optimizer(model, cfg)
    assert all(g["fused"] for g in fused.param_groups)
    looped_model = copy.deepcopy(model)
    looped = torch.optim.AdamW(
        param_groups(looped_model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps
    )
    for step in range(3):
        torch.manual_seed(step)
        for p, q in zip(model.parameters(), looped_model.parameters(), strict=True):
            q.grad = torch.randn_like(q)
            p.grad = q.grad.clone()
        fused.step()
        looped.step()
    # fp32: the fused kernel and the loop order AdamW's operations their own way, a few
    # ulps (1e-7) a step, over 3 steps
    for p, q in zip(model.parameters(), looped_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
