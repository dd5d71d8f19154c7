"""A stop rule ends a run at the evaluation it answers, with its reason and status, and
is never asked once the target is confirmed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from ledgerlm.config import EvalConfig
from ledgerlm.train.checkpointing import ResumedEval
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.train.record import Recorder
from ledgerlm.train.stopping import Patience, Projected, Stop, plan_rules


class AtStep:
    name = "at-step"

    def __init__(self, step: int, status: str = "pruned") -> None:
        self.step, self.status, self.asked = step, status, []

    def __call__(self, record, history):
        self.asked.append((record["step"], len(history)))
        if record["step"] >= self.step:
            return Stop(f"stopped at {record['step']}", self.status, {"seen": len(history)})
        return None


class Events(Recorder):
    def __init__(self) -> None:
        self.events = []

    def event(self, kind, message, step=None):
        self.events.append((kind, json.loads(message), step))


def _observe(rule, losses, earlier=(), **cfg):
    """Each loss in turn as an evaluation every 100 steps, after the ``earlier`` losses of
    a resumed run (in the ledger before its checkpoint, replayed by ``ResumedEval``)."""
    args = ([], EvalConfig(**cfg), "isolated", ["code"])
    if earlier:
        done = [{"step": 100 * (i + 1), "metrics": {"loss": v}} for i, v in enumerate(earlier)]
        evaluator = ResumedEval(*args, rules=(rule,), earlier=done, step=100 * len(earlier))
    else:
        evaluator = EvalCallback(*args, rules=(rule,))
    state = SimpleNamespace(should_stop=False, stop_reason="", stop_status="")
    # a model: with stop_at_target off the evaluator keeps the confirming weights
    trainer = SimpleNamespace(state=state, recorder=Events(), model=torch.nn.Linear(1, 1))
    for i, loss in enumerate(losses, start=len(earlier)):
        record = {"step": 100 * (i + 1), "metrics": {"loss": loss}}
        evaluator.history.append(record)
        evaluator.observe(record, trainer)
        if state.should_stop:
            break
    return state, trainer.recorder.events


def test_a_rule_stops_the_run_with_its_status_and_an_event():
    rule = AtStep(200)
    state, events = _observe(rule, [5.0, 4.0, 3.0], target_loss=1.0)
    assert (state.should_stop, state.stop_reason, state.stop_status) == (
        True,
        "stopped at 200",
        "pruned",
    )
    assert rule.asked == [(100, 1), (200, 2)]  # each evaluation, with the history so far
    [(kind, message, step)] = events
    assert (kind, step) == ("early_stop", 200)
    assert message == {"rule": "at-step", "reason": "stopped at 200", "status": "pruned", "seen": 2}


def test_no_rule_is_asked_once_the_target_is_confirmed():
    rule = AtStep(100)
    state, events = _observe(rule, [0.5], target_loss=1.0, stop_at_target=False)
    assert rule.asked == [] and events == [] and state.stop_status == ""


def test_a_stop_names_a_known_status():
    with pytest.raises(ValueError, match="status"):
        Stop("why", "reached")


NO_GAIN = "not reached (no improvement in 3 evaluations)"


def test_patience_stops_at_the_kth_evaluation_without_improvement_and_not_before():
    # The best is 4.0 at step 200; 4.0 again is no improvement (strictly below it is).
    losses = [5.0, 4.0, 4.5, 4.0, 4.2, 3.0]
    state, events = _observe(Patience("loss", 3), losses, target_loss=1.0)
    assert (state.stop_reason, state.stop_status) == (NO_GAIN, "not reached")
    [(kind, message, step)] = events
    assert (kind, step) == ("early_stop", 500)
    assert message == {
        "rule": "patience",
        "reason": NO_GAIN,
        "status": "not reached",
        "metric": "loss",
        "best": 4.0,
        "best_step": 200,
        "evaluations": 3,
        "min_delta": 0.0,
    }
    # One evaluation short of it, or an improvement in time, and the run goes on.
    for short in ([5.0, 4.0, 4.5, 4.0], [5.0, 4.0, 4.5, 4.0, 3.9, 4.1, 4.1]):
        state, events = _observe(Patience("loss", 3), short, target_loss=1.0)
        assert not state.should_stop and events == [], short


def test_patience_with_a_min_delta_adds_up_the_small_steps():
    # Each step is 0.05 below the last: under min_delta 0.1 the first two do not count,
    # the third (0.15 below the best, 5.0) does and becomes the best.
    losses = [5.0, 4.95, 4.9, 4.85, 4.8, 4.78, 4.76]
    _, events = _observe(Patience("loss", 3, min_delta=0.1), losses, target_loss=1.0)
    [(_, message, step)] = events
    assert step == 700 and (message["best"], message["best_step"]) == (4.85, 400)
    _, events = _observe(Patience("loss", 3), losses, target_loss=1.0)
    assert events == []  # strictly below the best each time


def test_patience_counts_the_evaluations_of_a_resumed_run_before_its_checkpoint():
    # Two evaluations without improvement were recorded before the kill: the first one
    # after the resume is the third.
    state, events = _observe(
        Patience("loss", 3), [4.9], earlier=[5.0, 4.0, 4.5, 4.2], target_loss=1.0
    )
    [(_, message, step)] = events
    assert step == 500 and message["best_step"] == 200 and state.stop_reason == NO_GAIN


def test_the_recipe_plan_names_its_rules_on_the_target_metric():
    assert plan_rules(EvalConfig(), 10_000) == ()
    cfg = EvalConfig(patience=2, min_delta=0.01, project=True, target_bpb=1.25, metric="loss/code")
    assert plan_rules(cfg, 10_000) == (
        Patience("bpb/code", 2, 0.01),
        Projected("bpb/code", 1.25, 10_000),
    )
    c = cfg.contract()
    assert (c["patience"], c["min_delta"], c["project"]) == (2, 0.01, True)
    c = EvalConfig().contract()
    assert (c["patience"], c["min_delta"], c["project"]) == (None, None, False)
