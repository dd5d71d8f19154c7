"""The optimizer step's loss uses one global denominator, whatever the micro-batch split."""

import numpy as np
import pytest
import torch
from ddp_step import ragged_rows

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import NonFiniteLossError, Trainer
from ledgerlm.train.optim import build_optimizer


def _one_step(split: tuple[int, int], **train):
    accum, rows_per = split
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2), 40).double()
    cfg = TrainConfig(
        max_steps=1, grad_accum=accum, micro_batch_rows=rows_per, grad_clip=0, **train
    )
    trainer = Trainer(
        model, build_optimizer(model, cfg), cfg, iter(batches(ragged_rows(), rows_per)), "isolated"
    )
    loss = trainer.train_step()
    return loss, {n: p.detach().clone() for n, p in model.named_parameters()}, trainer.state


@pytest.mark.parametrize(
    ("objective", "empty_rows"),
    [("token_mean", "exclude"), ("sequence_mean", "exclude"), ("sequence_mean", "zero")],
)
def test_loss_and_update_are_identical_for_every_micro_batch_split(objective, empty_rows):
    train = {"objective": objective, "empty_rows": empty_rows}
    ref_loss, ref_params, ref_state = _one_step((1, 8), **train)
    for split in [(2, 4), (8, 1)]:
        loss, params, state = _one_step(split, **train)
        assert loss == pytest.approx(ref_loss, rel=1e-9)
        for name, p in params.items():
            torch.testing.assert_close(p, ref_params[name], rtol=1e-9, atol=1e-12)
        assert state.targets == ref_state.targets and state.step == 1
        assert state.denominator == ref_state.denominator


def test_objective_and_empty_row_policy_reach_the_loss():
    token, _, token_state = _one_step((2, 4))
    seq, _, seq_state = _one_step((2, 4), objective="sequence_mean")
    zero, _, zero_state = _one_step((2, 4), objective="sequence_mean", empty_rows="zero")
    assert token_state.denominator == token_state.targets == token_state.step_targets
    assert (seq_state.denominator, zero_state.denominator) == (7, 8)  # one row has no target
    assert zero == pytest.approx(seq * 7 / 8, rel=1e-12)
    assert token != pytest.approx(seq, rel=1e-6)


def test_state_records_each_update():
    loss, _, state = _one_step((2, 4))
    rows = ragged_rows()
    record = state.history[-1]
    assert (record.step, record.loss, record.lr) == (1, loss, state.lr)
    assert (
        record.tokens
        == state.step_tokens
        == state.tokens
        == sum(int(r[3][:-1].sum()) for r in rows)
    )
    assert record.targets == state.targets and not record.skipped
    assert record.grad_norm == state.grad_norm and np.isfinite(record.grad_norm)
    assert state.counters()["optimizer_updates"] == 1


def test_non_finite_loss_stops_the_run():
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    with torch.no_grad():
        model.embed.weight[5] = float("nan")
    cfg = TrainConfig(max_steps=1, micro_batch_rows=8)
    rows = list(pack_documents([(np.full(40, 5), 0)], 17, 1, 2, 0))
    trainer = Trainer(model, build_optimizer(model, cfg), cfg, iter(batches(rows, 8)), "isolated")
    with pytest.raises(NonFiniteLossError, match="step 1"):
        trainer.train_step()
