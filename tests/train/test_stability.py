"""Requirement L6: gradient norm, clipping and non-finite values are observed, never silent."""

import json
import math

import numpy as np
import pytest
import torch

from finite import Poison
from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import NonFiniteLossError, Trainer
from ledgerlm.train.optim import build_optimizer


def _batches(n: int = 12):
    """Distinct micro-batches of 4 rows, documents from domains 0, 1 and 2."""
    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, 40, size=rng.integers(4, 30)), i % 3) for i in range(40 * n)]
    out = list(batches(pack_documents(docs, 17, 1, 2, 0), 4))[:n]
    assert len(out) == n
    return out


class _StepCounter:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        self.steps.append(trainer.state.step)

    def on_train_end(self, trainer) -> None:
        pass


def _trainer(policy: str, data, poison_at: int | None = 3, recorder=None, **train) -> Trainer:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    if poison_at:
        model.register_forward_hook(Poison(poison_at))
    cfg = TrainConfig(nonfinite=policy, max_steps=5, micro_batch_rows=4, **train)
    return Trainer(
        model, build_optimizer(model, cfg), cfg, iter(data), "isolated", [_StepCounter()], recorder
    )


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_stop_raises_with_the_step_and_keeps_the_event():
    trainer = _trainer("stop", _batches())
    with pytest.raises(NonFiniteLossError, match="step 3"):
        trainer.fit()
    assert trainer.state.step == 2
    (event,) = trainer.events
    assert event["step"] == 3 and event["loss"] == "nan" and event["policy"] == "stop"


def test_skip_drops_the_update_consumes_the_data_and_training_finishes():
    data = _batches()
    trainer = _trainer("skip", data)
    trainer.train_step()
    trainer.train_step()
    before, tokens, adam = _params(trainer.model), trainer.state.tokens, trainer.optimizer.state
    adam_steps = {id(p): float(s["step"]) for p, s in adam.items()}
    loss = trainer.train_step()  # the poisoned one
    assert math.isnan(loss)
    s = trainer.state
    assert s.step == 2 and s.skipped_steps == 1 and s.history[-1].skipped
    for a, b in zip(before, trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert {id(p): float(st["step"]) for p, st in adam.items()} == adam_steps
    assert all(p.grad is None for p in trainer.model.parameters())
    # the poisoned batch is gone: the tokens were consumed and the next step reads batch 4
    assert s.tokens == tokens + int(data[2].valid.sum())
    assert s.targets == data[0].num_targets + data[1].num_targets
    state = trainer.fit()
    assert state.step == 5 and state.stop_reason == "max_steps"
    assert state.tokens == sum(int(b.valid.sum()) for b in data[:6])
    assert [r.skipped for r in state.history] == [False, False, True, False, False, False]
    assert state.counters()["skipped_updates"] == 1
    assert trainer.callbacks[0].steps == [3, 4, 5]


def test_non_finite_event_reaches_the_ledger_with_its_data(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run_id = ledger.create_run("t", {}, target_metric="loss", target_value=1.0, eval_every=1)
    data = _batches()
    trainer = _trainer("skip", data, recorder=LedgerRecorder(ledger, run_id))
    assert trainer.fit().step == 5
    assert trainer.callbacks[0].steps == [1, 2, 3, 4, 5]  # none for the skipped attempt
    events = [e for e in ledger.run_summary(run_id)["events"] if e["kind"] == "nonfinite"]
    assert len(events) == 1 and events[0]["step"] == 3
    message = json.loads(events[0]["message"])
    assert message == trainer.events[0]
    bad = data[2]
    assert message["rows"] == 4 and message["targets"] == bad.num_targets
    domains = sorted(set(bad.target_domains[bad.loss_mask].tolist()))
    assert message["target_domains"] == domains and len(domains) > 1
    segments = bad.doc_ids[bad.doc_ids >= 0]
    assert message["segments"] == [int(segments.min()), int(segments.max())]
    ledger.close()


def test_stop_records_the_event_before_raising(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run_id = ledger.create_run("t", {}, target_metric="loss", target_value=1.0, eval_every=1)
    trainer = _trainer("stop", _batches(), poison_at=1, recorder=LedgerRecorder(ledger, run_id))
    with pytest.raises(NonFiniteLossError, match="step 1"):
        trainer.fit()
    kinds = [e["kind"] for e in ledger.run_summary(run_id)["events"]]
    assert kinds == ["nonfinite"]
    ledger.close()


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_infinite_gradient_with_a_finite_loss_is_caught(policy):
    trainer = _trainer(policy, _batches(), poison_at=None)
    trainer.model.embed.weight.register_hook(lambda g: g * math.inf)
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match="step 1"):
            trainer.train_step()
    else:
        before = _params(trainer.model)
        loss = trainer.train_step()
        assert math.isfinite(loss) and trainer.state.step == 0
        assert all(
            torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
        )
    assert trainer.events[0]["loss"] != "nan" and trainer.events[0]["grad_norm"] in ("inf", "nan")


def test_a_model_broken_for_good_still_stops_under_skip():
    trainer = _trainer("skip", _batches(), poison_at=None)
    trainer.max_consecutive_skips = 3
    with torch.no_grad():
        trainer.model.norm.weight.fill_(math.nan)
    with pytest.raises(NonFiniteLossError, match="3 non-finite steps in a row"):
        trainer.fit()
    assert len(trainer.events) == 3 and trainer.state.step == 0


@pytest.mark.parametrize("clip", [0.05, 0.0])
def test_grad_norm_is_recorded_and_clipping_bounds_the_update(clip):
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    cfg = TrainConfig(max_steps=3, micro_batch_rows=4, grad_clip=clip, warmup_steps=0)
    cfg = cfg.model_copy(update={"schedule": "constant"})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)  # update = lr * applied gradient
    trainer = Trainer(model, sgd, cfg, iter(_batches()), "isolated")
    for _ in range(3):
        before = _params(model)
        trainer.train_step()
        delta = torch.cat(
            [(a - b.detach()).flatten() for a, b in zip(before, model.parameters(), strict=True)]
        )
        applied = float(delta.norm()) / 0.1
        recorded = trainer.state.grad_norm
        assert math.isfinite(recorded) and recorded == trainer.state.history[-1].grad_norm
        if clip:
            assert recorded > clip  # clipping was active...
            assert applied <= clip * (1 + 1e-5)  # ...and bounded the update
        else:  # fp32: before - after keeps only the low bits of each weight (cancellation)
            assert applied == pytest.approx(recorded, rel=1e-5)
    assert len(trainer.state.history) == 3
