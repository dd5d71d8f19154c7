"""Requirement L5: warmup and decay by optimizer step or by consumed tokens, stated explicitly."""

import math

import numpy as np
import pytest
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer, lr_at, lr_factor, schedule_position

SHAPES = ["cosine", "linear", "wsd", "constant"]


def _cfg(schedule: str, **kw) -> TrainConfig:
    base = dict(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, max_steps=110, decay_fraction=0.2)
    return TrainConfig(schedule=schedule, **{**base, **kw})


def test_seed_l5_warmup_by_tokens_is_at_half_peak_halfway():
    cfg = TrainConfig(
        lr=1.0, schedule_unit="tokens", warmup_tokens=1000, schedule_tokens=10_000, max_steps=3
    )
    assert lr_at(1, cfg, tokens=500) == pytest.approx(0.5)
    assert lr_at(1, cfg, tokens=0) == 0.0  # tokens consumed *before* the update
    assert lr_at(1, cfg, tokens=1000) == pytest.approx(1.0)
    assert lr_at(1, cfg, tokens=10_000) == pytest.approx(0.1)
    # the step number plays no part in a token schedule
    assert lr_at(3, cfg, tokens=500) == lr_at(1, cfg, tokens=500)
    assert schedule_position(cfg, 3, 500) == 500
    with pytest.raises(ValueError):
        lr_at(1, cfg, tokens=-1)


@pytest.mark.parametrize("schedule", SHAPES)
def test_every_shape_warms_up_linearly_to_peak(schedule):
    cfg = _cfg(schedule)
    assert lr_at(5, cfg) == pytest.approx(0.5)
    assert lr_at(10, cfg) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("schedule", "quarter", "middle", "late", "end"),
    [
        ("cosine", 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, None, 0.1),
        ("linear", 0.775, 0.55, None, 0.1),
        ("wsd", 1.0, 1.0, 0.55, 0.1),  # decay over steps 88..110; 99 is halfway
        ("constant", 1.0, 1.0, 1.0, 1.0),
    ],
)
def test_shape_values_after_warmup(schedule, quarter, middle, late, end):
    cfg = _cfg(schedule)
    assert lr_at(35, cfg) == pytest.approx(quarter)
    assert lr_at(60, cfg) == pytest.approx(middle)
    if late is not None:
        assert lr_at(99, cfg) == pytest.approx(late)
    assert lr_at(110, cfg) == pytest.approx(end)
    assert lr_at(500, cfg) == pytest.approx(end)  # past the end it stays at the floor


def test_wsd_is_flat_until_its_decay_window():
    cfg = _cfg("wsd")
    assert [lr_at(s, cfg) for s in (11, 50, 88)] == [1.0, 1.0, 1.0]
    assert lr_at(89, cfg) < 1.0
    # a decay window longer than the post-warmup span starts where warmup ends
    full = _cfg("wsd", decay_fraction=1.0)
    assert lr_at(10, full) == pytest.approx(1.0)
    assert lr_at(60, full) == pytest.approx(0.55)


@pytest.mark.parametrize("schedule", SHAPES)
def test_token_schedule_has_the_same_shape(schedule):
    by_steps = _cfg(schedule)
    by_tokens = _cfg(
        schedule, schedule_unit="tokens", warmup_tokens=10_000, schedule_tokens=110_000
    )
    for step in (1, 5, 10, 35, 60, 99, 110):
        assert lr_factor(step * 1000, by_tokens) == pytest.approx(lr_factor(step, by_steps))


def test_without_warmup_decay_starts_at_once():
    by_steps = _cfg("linear", warmup_steps=0, max_steps=100)
    assert lr_at(1, by_steps) == pytest.approx(1 - 0.9 / 100)  # update 1 of 100
    assert lr_at(100, by_steps) == pytest.approx(0.1)
    by_tokens = _cfg("linear", schedule_unit="tokens", schedule_tokens=100)
    assert lr_at(1, by_tokens, tokens=0) == pytest.approx(1.0)  # nothing consumed yet


# -- in the loop -----------------------------------------------------------------------


def _stream():
    rng = np.random.default_rng(1)
    docs = [(rng.integers(3, 40, size=rng.integers(1, 30)), 0) for _ in range(400)]
    return list(pack_documents(docs, 17, 1, 2, 0))


def _trainer(cfg: TrainConfig, rows) -> Trainer:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    return Trainer(
        model,
        build_optimizer(model, cfg),
        cfg,
        iter(batches(rows, cfg.micro_batch_rows)),
        "isolated",
    )


def test_loop_sets_each_group_to_its_own_peak_times_the_factor():
    cfg = TrainConfig(
        optimizer="muon",
        lr=1e-3,
        muon_lr=0.02,
        schedule="constant",
        warmup_steps=4,
        max_steps=8,
        micro_batch_rows=4,
    )
    trainer = _trainer(cfg, _stream())
    trainer.train_step()
    lrs = {g["base_lr"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert lrs == pytest.approx({1e-3: 0.25e-3, 0.02: 0.005})
    assert trainer.state.lr == pytest.approx(0.25e-3)


def test_token_schedule_in_the_loop_reads_tokens_consumed_before_the_update():
    cfg = TrainConfig(
        lr=1.0,
        schedule_unit="tokens",
        warmup_tokens=200,
        schedule_tokens=2000,
        schedule="linear",
        max_steps=4,
        micro_batch_rows=4,
    )
    trainer = _trainer(cfg, _stream())
    trainer.fit()
    consumed = 0
    for record in trainer.state.history:
        assert record.lr == pytest.approx(lr_at(record.step, cfg, tokens=consumed))
        consumed += record.tokens
    assert consumed == trainer.state.tokens


@pytest.mark.parametrize("unit", ["steps", "tokens"])
def test_resumed_run_at_the_same_position_gets_the_same_lr(unit):
    cfg = TrainConfig(
        lr=1.0,
        schedule="cosine",
        schedule_unit=unit,
        warmup_steps=2,
        max_steps=6,
        warmup_tokens=100,
        schedule_tokens=600,
        micro_batch_rows=4,
    )
    rows = _stream()
    full = _trainer(cfg, rows)
    full.fit()
    history = full.state.history
    resumed = _trainer(cfg, rows[3 * 4 :])  # the data stream after 3 updates
    resumed.state.step = 3
    resumed.state.tokens = sum(r.tokens for r in history[:3])
    resumed.fit()
    assert [r.lr for r in resumed.state.history] == [r.lr for r in history[3:]]
