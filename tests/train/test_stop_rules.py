"""A stop rule ends a run at the evaluation it answers, with its reason and status, and
is never asked once the target is confirmed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from ledgerlm.config import EvalConfig
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.train.record import Recorder
from ledgerlm.train.stopping import Stop


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


def _observe(rule, losses, **cfg):
    evaluator = EvalCallback([], EvalConfig(**cfg), "isolated", ["code"], rules=(rule,))
    state = SimpleNamespace(should_stop=False, stop_reason="", stop_status="")
    trainer = SimpleNamespace(state=state, recorder=Events())
    for i, loss in enumerate(losses):
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
