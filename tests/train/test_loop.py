"""The optimizer step's loss uses one global denominator, whatever the micro-batch split."""

import numpy as np
import pytest
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import NonFiniteLossError, Trainer
from ledgerlm.train.optim import build_optimizer


def _rows():
    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, 40, size=rng.integers(1, 30)), 0) for _ in range(40)]
    rows = list(pack_documents(docs, 17, 1, 2, 0))[:8]
    assert len(rows) == 8
    return rows


def _one_step(split: tuple[int, int]):
    accum, rows_per = split
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2), 40).double()
    cfg = TrainConfig(max_steps=1, grad_accum=accum, micro_batch_rows=rows_per, grad_clip=0)
    trainer = Trainer(
        model, build_optimizer(model, cfg), cfg, iter(batches(_rows(), rows_per)), "isolated"
    )
    loss = trainer.train_step()
    return loss, {n: p.detach().clone() for n, p in model.named_parameters()}, trainer.state


def test_loss_and_update_are_identical_for_every_micro_batch_split():
    ref_loss, ref_params, ref_state = _one_step((1, 8))
    for split in [(2, 4), (8, 1)]:
        loss, params, state = _one_step(split)
        assert loss == pytest.approx(ref_loss, rel=1e-9)
        for name, p in params.items():
            torch.testing.assert_close(p, ref_params[name], rtol=1e-9, atol=1e-12)
        assert state.targets == ref_state.targets and state.step == 1


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
