"""MLLOG of a run whose target is a task accuracy: the target's direction, the accuracy
the ledger judges (the interval's lower bound under confirm_by = "interval"), the run
stopping where the ledger confirmed, an evaluation written after the fact left out;
judged by mlperf_logging's own checker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.ledger.compare_tasks import after_the_fact
from ledgerlm.report.mllog import check_mllog, export_mllog
from report.task_ledger import accuracy

TOKEN = ":::MLLOG "
EVERY = 10
METRIC = "task/arith/exact_match"


def _run(ws: Path, correct: list[int], confirm_by: str) -> dict:
    """Evaluations every EVERY updates, arith right on ``correct`` of 100 items, a target
    of 0.25; then an evaluation of step 10 written after the fact."""
    recipe = load_recipe(TINY, [f"eval.every_steps={EVERY}"]).to_dict()
    contract = {"metric": METRIC, "unit": "accuracy", "threshold": 0.25, "confirm": 1,
                "targets": {METRIC: 0.25}, "confirm_by": confirm_by}  # fmt: skip
    with Ledger(ws / "ledger.db") as led:
        run = led.create_run("tasks", recipe, target_metric=METRIC, target_value=0.25,
                             eval_every=EVERY, meta={"contract": contract})  # fmt: skip
        with led.phase(run, "prep"):
            pass
        led.add_event(run, "target_contract", json.dumps({**contract, "ranks": 1}))
        clock = PhaseClock(led, run)
        clock.start("train", 0)
        for i, n in enumerate(correct, 1):
            with clock.interrupt("eval", i * EVERY) as phase:
                pass
            metrics = {"loss": 5.0 - i, **accuracy("arith", "exact_match", n, 100)}
            led.add_evaluation(
                run, step=i * EVERY, tokens=i * EVERY * 1024, targets=i * EVERY * 1000,
                updates=i * EVERY, metrics=metrics, snapshot=f"w{i}", phase_id=phase.id,
            )  # fmt: skip
        clock.stop(len(correct) * EVERY)
        after = led.record_phase(run, "eval_after", 1.0, detail={"snapshot_step": EVERY})
        led.add_evaluation(
            run, step=EVERY, tokens=EVERY * 1024, targets=EVERY * 1000, updates=EVERY,
            metrics=accuracy("arith", "exact_match", 99, 100), snapshot="w1", phase_id=after,
        )  # fmt: skip
        led.finish_run(run, "reached")
        return led.run_summary(run)


def _lines(path: Path, key: str) -> list[dict]:
    records = [json.loads(x[len(TOKEN) :]) for x in path.read_text().splitlines()]
    return [r for r in records if r["key"] == key]


@pytest.mark.parametrize("confirm_by", ["threshold", "interval"])
def test_a_task_target_exports_a_compliant_log(tmp_path: Path, confirm_by: str) -> None:
    pytest.importorskip("mlperf_logging")
    # 30 of 100: 0.30 clears 0.25, its Wilson lower bound (0.218) does not; 40: 0.309 does
    summary = _run(tmp_path, [20, 30, 40, 45], confirm_by)
    step = 20 if confirm_by == "threshold" else 30
    assert summary["time_to_target"]["step"] == step
    path = export_mllog(summary, tmp_path / "mllog.txt")
    assert check_mllog(path) == []
    (target,) = _lines(path, "eval_accuracy_target")
    judged = METRIC if confirm_by == "threshold" else f"{METRIC}_low"
    assert target["metadata"]["direction"] == "higher_is_better"
    assert target["metadata"]["metric"] == judged
    accuracies = _lines(path, "eval_accuracy")
    assert [a["metadata"]["epoch_num"] for a in accuracies] == list(range(EVERY, step + 1, EVERY))
    later = after_the_fact(summary)
    in_loop = {e["step"]: e["metrics"] for e in summary["evaluations"] if e["id"] not in later}
    assert [a["value"] for a in accuracies] == [
        in_loop[a["metadata"]["epoch_num"]][judged] for a in accuracies
    ]
    assert all(a["value"] != pytest.approx(0.99) for a in accuracies)  # after the fact: out
    (stop,) = _lines(path, "run_stop")
    assert stop["metadata"]["status"] == "success"
