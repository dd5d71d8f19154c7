"""The target contract in the training loop: metric, interval by steps or tokens,
the confirmation rule, budgets, and asynchronous evaluation bound to its snapshot."""

import itertools
import json
import time

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from finite import assert_finite
from ledgerlm.config import EvalConfig, ModelConfig, TrainConfig
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.budget import BudgetCallback
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer

DOMAINS = ["a", "b"]


def _rows(seed: int, n_docs: int):
    rng = np.random.default_rng(seed)
    # Domain a repeats a short cycle (learnable fast); domain b is noise.
    docs = []
    for i in range(n_docs):
        if i % 2 == 0:
            start = int(rng.integers(0, 5))
            docs.append((np.array([3 + (start + k) % 5 for k in range(24)]), 0))
        else:
            docs.append((rng.integers(3, 30, size=24), 1))
    return list(pack_documents(docs, 33, 1, 2, 0))


def _trainer(tmp_path=None, steps=30, train_extra=None, **eval_cfg):
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 32)
    cfg = TrainConfig(
        max_steps=steps, micro_batch_rows=4, lr=1e-2, warmup_steps=0, **(train_extra or {})
    )
    val = list(batches(_rows(1, 8), 4))
    ecfg = EvalConfig(**{"every_steps": 5, "target_loss": 0.1, **eval_cfg})
    evaluator = EvalCallback(val, ecfg, "isolated", DOMAINS)
    recorder = None
    if tmp_path is not None:
        ledger = Ledger(tmp_path / "ledger.db")
        run = ledger.create_run(
            "t",
            {},
            target_metric=ecfg.metric,
            target_value=ecfg.target_loss,
            eval_every=ecfg.every_steps,
            meta={"contract": ecfg.contract()},
        )
        recorder = LedgerRecorder(ledger, run)
    stream = itertools.cycle(list(batches(_rows(0, 64), 4)))
    callbacks = [evaluator, BudgetCallback(ecfg, started_at=time.time())]
    trainer = Trainer(
        model,
        build_optimizer(model, cfg),
        cfg,
        stream,
        "isolated",
        callbacks=callbacks,
        recorder=recorder,
    )
    return trainer, evaluator


def test_metric_must_name_the_loss_or_a_domain_loss():
    assert EvalConfig(metric="loss/code").metric == "loss/code"
    for bad in ("accuracy", "loss/", "loss/a/b", "loss code"):
        with pytest.raises(ValidationError):
            EvalConfig(metric=bad)
    c = EvalConfig(every_tokens=1000, confirm=3, budget_tokens=5, budget_seconds=2.5).contract()
    assert c["every_steps"] is None and c["every_tokens"] == 1000 and c["confirm"] == 3
    assert c["budget_tokens"] == 5 and c["budget_seconds"] == 2.5


def test_interval_by_tokens():
    trainer, evaluator = _trainer(steps=12, every_tokens=400)
    trainer.fit()
    tokens_per_step = 4 * 33
    steps = [e["step"] for e in evaluator.history]
    # An evaluation each time another 400 tokens were consumed, plus the last step.
    expected = [
        s for s in range(1, 13) if (s * tokens_per_step) // 400 > ((s - 1) * tokens_per_step) // 400
    ]
    assert steps == expected + ([12] if expected[-1] != 12 else [])


def test_confirmation_rule_and_domain_metric_decide_the_stop():
    trainer, evaluator = _trainer(steps=60, metric="loss/a", target_loss=1.5, confirm=2)
    state = trainer.fit()
    history = [(e["step"], e["metrics"]["loss/a"]) for e in evaluator.history]
    below = [s for s, v in history if v <= 1.5]
    assert below, history  # the learnable domain does get under the threshold
    # Stopped at the first evaluation completing two consecutive ones at or below it.
    streak, confirmed = 0, None
    for s, v in history:
        streak = streak + 1 if v <= 1.5 else 0
        if streak == 2:
            confirmed = s
            break
    assert evaluator.reached_step == confirmed == state.step
    assert state.stop_reason == "target confirmed"
    assert max(e["metrics"]["loss/b"] for e in evaluator.history) > 1.5  # overall would differ


@pytest.mark.parametrize(
    "budget", [{"budget_tokens": 1320}, {"budget_seconds": 1e-9}, {"budget_device_hours": 1e-12}]
)
def test_budget_stops_training(budget):
    trainer, evaluator = _trainer(steps=60, **budget)
    state = trainer.fit()
    if "budget_tokens" in budget:
        # Stopped at the first update that reached the budget.
        assert state.tokens - state.step_tokens < 1320 <= state.tokens
        assert state.stop_reason.startswith("token budget")
    elif "budget_seconds" in budget:
        assert state.step == 1 and state.stop_reason.startswith("time budget")
    else:
        assert state.step == 1
        assert state.stop_reason == "device-time budget (1e-12 device-hours)"
    assert evaluator.history[-1]["step"] == state.step  # the final state is still evaluated


def test_device_time_budget_counts_what_the_run_held_before_this_process():
    # A run resumed on 1 rank after 100 s on 2 ranks (200 device-seconds): its started_at
    # lies 100 s back, and each wall second from here adds one device-second.
    now = 1_000.0
    resumed = BudgetCallback(EvalConfig(), started_at=now - 100.0, before=(100.0, 200.0))
    assert resumed.device_seconds(ranks=1, now=now) == pytest.approx(200.0)
    assert resumed.device_seconds(ranks=1, now=now + 10.0) == pytest.approx(210.0)
    assert resumed.device_seconds(ranks=2, now=now + 10.0) == pytest.approx(220.0)
    fresh = BudgetCallback(EvalConfig(), started_at=now)  # nothing held before
    assert fresh.device_seconds(ranks=2, now=now + 3.0) == pytest.approx(6.0)
    c = EvalConfig(budget_device_hours=0.5).contract()
    assert (
        c["budget_device_hours"] == 0.5 and EvalConfig().contract()["budget_device_hours"] is None
    )


def test_a_device_time_budget_out_of_reach_leaves_training_alone():
    trainer, _ = _trainer(steps=12, budget_device_hours=1e6)
    state = trainer.fit()
    assert state.step == 12 and not (state.stop_reason or "").startswith("device-time")


def test_asynchronous_evaluation_scores_the_same_snapshots(tmp_path):
    for name in ("s", "a"):
        (tmp_path / name).mkdir()
    sync, sync_eval = _trainer(tmp_path / "s", steps=20)
    sync.fit()
    trainer, evaluator = _trainer(tmp_path / "a", steps=20, asynchronous=True)
    trainer.fit()
    # Training is untouched by the background evaluations: same snapshots, same metrics.
    by_step = {e["step"]: e for e in sync_eval.history}
    assert [e["step"] for e in evaluator.history] == [5, 10, 15, 20]
    for e in evaluator.history:
        assert e["snapshot"] == by_step[e["step"]]["snapshot"]
        assert e["metrics"] == pytest.approx(by_step[e["step"]]["metrics"], rel=1e-9)
    ledger = trainer.recorder.ledger
    summary = ledger.run_summary(trainer.recorder.run_id)
    evals = {p["id"]: p for p in summary["phases"] if p["kind"] == "eval"}
    for e in summary["evaluations"]:
        phase = evals[e["phase_id"]]
        if phase["detail"].get("asynchronous"):
            assert phase["detail"]["snapshot_step"] == e["step"]
            assert phase["detail"]["eval_wall_seconds"] > 0
            assert phase["detail"]["eval_compute_seconds"] > 0
    assert sum(bool(p["detail"].get("asynchronous")) for p in evals.values()) >= 3
    assert_finite(summary)
    json.dumps(summary, allow_nan=False)  # strict JSON: a NaN or an infinity raises
