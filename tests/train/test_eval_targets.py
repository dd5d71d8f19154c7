"""The trainer's confirmation rule and the ledger's are one: per-domain targets too."""

from types import SimpleNamespace

from ledgerlm.config import EvalConfig
from ledgerlm.train.evaluate import EvalCallback


def test_training_stops_only_when_every_listed_domain_meets_its_target():
    cfg = EvalConfig(target_loss=3.0, targets={"code": 3.1}, confirm=2)
    evaluator = EvalCallback([], cfg, "isolated", ["code", "math"])
    trainer = SimpleNamespace(state=SimpleNamespace(should_stop=False, stop_reason=""))
    steps = [
        (100, {"loss": 2.9, "loss/code": 3.2}),  # code above its threshold
        (200, {"loss": 2.8, "loss/code": 3.1}),
        (300, {"loss": 2.7, "loss/code": 3.0}),  # second in a row: confirmed
    ]
    for step, metrics in steps:
        evaluator.observe({"step": step, "metrics": metrics}, trainer)
        if step < 300:
            assert not trainer.state.should_stop
    assert evaluator.reached_step == 300
    assert trainer.state.stop_reason == "target confirmed"
