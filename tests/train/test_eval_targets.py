"""The trainer's confirmation rule and the ledger's are one: the same evaluations stop
training at the step the ledger's time-to-target names, per-domain targets too."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from ledgerlm.config import EvalConfig
from ledgerlm.ledger.store import Ledger
from ledgerlm.train.evaluate import EvalCallback


def _trainer_step(cfg: EvalConfig, evals: list[tuple[int, dict]]) -> tuple[int | None, str]:
    """Where the trainer's callback confirms the target, and the stop reason it set."""
    evaluator = EvalCallback([], cfg, "isolated", ["code", "math"])
    trainer = SimpleNamespace(state=SimpleNamespace(should_stop=False, stop_reason=""))
    for step, metrics in evals:
        evaluator.observe({"step": step, "metrics": metrics}, trainer)
    return evaluator.reached_step, trainer.state.stop_reason


def _ledger_step(tmp_path, cfg: EvalConfig, evals: list[tuple[int, dict]]) -> int | None:
    """Where the ledger confirms it: a run registered with the contract as ``lab.run``
    writes it, its evaluations in a real SQLite ledger, the verdict ``run_summary``
    computes."""
    metric, threshold, _ = cfg.target()
    with Ledger(tmp_path / "ledger.db") as ledger:
        meta = {"contract": cfg.contract()}
        run = ledger.create_run("unit", {}, target_metric=metric, target_value=threshold,
                                eval_every=cfg.every_steps, meta=meta)  # fmt: skip
        for step, metrics in evals:
            ledger.add_evaluation(run, step=step, tokens=step, targets=step, updates=step,
                                  metrics=metrics, snapshot=f"s{step}", phase_id=None)  # fmt: skip
        return ledger.run_summary(run)["time_to_target"]["step"]


def _losses(*values: float) -> list[tuple[int, dict]]:
    return [(100 * (i + 1), {"loss": v}) for i, v in enumerate(values)]


CASES = {
    # a miss resets the streak: the second pair in a row confirms, not the third hit
    "streak reset": ({"target_loss": 3.0, "confirm": 2}, _losses(2.9, 3.1, 3.0, 2.9), 400),
    # at the threshold counts (<=, not <)
    "at the threshold": ({"target_loss": 3.0}, _losses(3.2, 3.0), 200),
    "three in a row": ({"target_loss": 2.5, "confirm": 3}, _losses(2, 2, 5, 2, 2, 2), 600),
    "never confirmed": ({"target_loss": 2.5, "confirm": 2}, _losses(2, 5, 2, 5, 2), None),
    # a failed measurement never confirms, -inf included
    "not finite": ({"target_loss": 3.0}, _losses(-math.inf, math.nan, 2.9), 300),
    "per domain": (
        {"target_loss": 3.0, "targets": {"code": 3.1}, "confirm": 2},
        [
            (100, {"loss": 2.9, "loss/code": 3.2}),  # code above its threshold
            (200, {"loss": 2.8, "loss/code": 3.1}),  # both at or below
            (300, {"loss": 2.7}),  # code not measured: not met
            (400, {"loss": 2.7, "loss/code": 3.0}),
            (500, {"loss": 2.6, "loss/code": 3.0}),
        ],
        500,
    ),
    "a domain's loss as the metric": (
        {"metric": "loss/math", "target_loss": 2.5},
        [(100, {"loss": 2.0, "loss/math": 2.6}), (200, {"loss": 3.0, "loss/math": 2.5})],
        200,
    ),
    # with target_bpb the metric is bpb, whatever the loss in nat/token says
    "bits per byte": (
        {"target_bpb": 1.2},
        [(100, {"loss": 1.0, "bpb": 1.5}), (200, {"loss": 9.0, "bpb": 1.2})],
        200,
    ),
}


@pytest.mark.parametrize(("contract", "evals", "expected"), CASES.values(), ids=CASES.keys())
def test_the_trainer_and_the_ledger_confirm_at_the_same_evaluation(
    tmp_path, contract, evals, expected
):
    cfg = EvalConfig(**contract)
    trained, reason = _trainer_step(cfg, evals)
    assert trained == expected
    assert reason == ("target confirmed" if expected is not None else "")
    assert _ledger_step(tmp_path, cfg, evals) == trained


def test_a_ledger_rule_apart_from_the_trainer_s_is_caught(tmp_path, monkeypatch):
    # the check above is not vacuous: a ledger that confirms only strictly below the
    # threshold (the trainer keeps <=) names another step for the same evaluations
    import ledgerlm.ledger.target as target

    real = target.meets

    def strict(metrics, metric, threshold, targets=None, confirm_by="threshold"):
        ok = real(metrics, metric, threshold, targets, confirm_by)
        return ok and metrics[metric] < threshold

    monkeypatch.setattr(target, "meets", strict)
    cfg = EvalConfig(target_loss=3.0, confirm=2)
    evals = _losses(2.9, 3.0, 2.9)
    assert _trainer_step(cfg, evals)[0] == 200
    assert _ledger_step(tmp_path, cfg, evals) != 200
