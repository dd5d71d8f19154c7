"""The bill of a run with tasks: their seconds within the charged evaluations, and the
evaluations written after the fact (``eval_after``) neither confirming, breaking a streak
nor being charged, through the real ledger's ``run_summary`` as well as on plain rows."""

from ledgerlm.ledger.store import Ledger
from ledgerlm.ledger.target import EVAL_AFTER, TimeToTarget, time_to_target

METRIC = "task/qa/acc"


def phase(i, kind, seconds, **detail):
    return {"id": i, "kind": kind, "seconds": seconds, "detail": detail}


def ev(step, acc, phase_id):
    return {"step": step, "metrics": {METRIC: acc}, "phase_id": phase_id}


PHASES = [
    phase(1, "train", 10.0),
    phase(2, "eval", 3.0, task_seconds={"qa": 1.25, "sum": 0.5}),
    phase(3, "train", 10.0),
    phase(4, EVAL_AFTER, 100.0, task_seconds={"qa": 90.0}),
    phase(5, "eval", 2.0, task_seconds={"qa": 1.0}),
    phase(6, "train", 10.0),
    phase(7, "eval", 2.0, task_seconds={"qa": 1.0}),
]


def test_task_seconds_sum_the_charged_eval_phases_and_round_trip():
    evals = [ev(10, 0.2, 2), ev(20, 0.9, 5)]
    verdict = time_to_target(PHASES, evals, METRIC, 0.5)
    assert verdict.reached and verdict.step == 20
    assert verdict.task_seconds == 1.25 + 0.5 + 1.0  # the phase at step 30 is not charged
    assert EVAL_AFTER not in verdict.by_phase and verdict.seconds == 10 + 3 + 10 + 2
    assert TimeToTarget.from_dict(verdict.to_dict()) == verdict
    # an older summary, before tasks, has no such key: None, as a run without tasks
    old = {k: v for k, v in verdict.to_dict().items() if k != "task_seconds"}
    assert TimeToTarget.from_dict(old).task_seconds is None
    plain = [phase(1, "train", 1.0), phase(2, "eval", 1.0)]
    assert time_to_target(plain, [ev(1, 0.9, 2)], METRIC, 0.5).task_seconds is None


def test_an_after_the_fact_evaluation_neither_confirms_nor_breaks_a_streak():
    # alone above the threshold, it does not confirm
    after = ev(15, 0.99, 4)
    assert not time_to_target(PHASES, [ev(10, 0.2, 2), after], METRIC, 0.5).reached
    # between two evaluations of a streak of 2 (at a step between them), below the
    # threshold: the streak holds and the bill stops at the second in-run evaluation
    low = ev(15, 0.0, 4)
    verdict = time_to_target(PHASES, [ev(10, 0.9, 2), low, ev(20, 0.9, 5)], METRIC, 0.5, 2)
    assert verdict.reached and verdict.step == 20 and verdict.evaluation["phase_id"] == 5
    assert verdict.by_phase == {"train": 20.0, "eval": 5.0}


def test_run_summary_bills_task_seconds_and_skips_the_after_the_fact_phase(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        contract = {"contract": {"confirm": 1}}
        run = ledger.create_run(
            "t", {}, target_metric=METRIC, target_value=0.5, eval_every=5, meta=contract
        )
        ledger.record_phase(run, "train", 10.0)
        first = ledger.record_phase(run, "eval", 2.0, detail={"task_seconds": {"qa": 0.75}})
        after = ledger.record_phase(run, EVAL_AFTER, 38.0, detail={"task_seconds": {"qa": 30}})
        base = {"tokens": 1, "targets": 1, "updates": 1, "snapshot": "x"}
        ledger.add_evaluation(run, step=5, metrics={METRIC: 0.1}, phase_id=first, **base)
        ledger.add_evaluation(run, step=5, metrics={METRIC: 0.9}, phase_id=after, **base)
        verdict = ledger.run_summary(run)["time_to_target"]
        assert verdict["reached"] is False  # the after-the-fact 0.9 does not confirm
        late = ledger.record_phase(run, "eval", 1.0, detail={"task_seconds": {"qa": 0.5}})
        ledger.add_evaluation(run, step=6, metrics={METRIC: 0.9}, phase_id=late, **base)
        verdict = ledger.run_summary(run)["time_to_target"]
    assert verdict["reached"] and verdict["step"] == 6
    assert verdict["task_seconds"] == 0.75 + 0.5
    assert verdict["seconds"] == 10.0 + 2.0 + 1.0  # the after-the-fact 38 s not charged
    assert verdict["device_seconds"] == verdict["seconds"]


def test_a_background_evaluation_charges_its_tasks_their_share_of_the_wait():
    """Training waited 0.5 s for an evaluation that took 4 s in its thread, 3 s of
    which were tasks: 0.375 s of the bill's eval seconds were the tasks'."""
    phases = [
        phase(1, "train", 10.0),
        phase(2, "eval", 0.5, task_seconds={"qa": 2.0, "sum": 1.0}, eval_wall_seconds=4.0),
        phase(3, "eval", 1.0, task_seconds={"qa": 0.25}),  # synchronous: all of it
    ]
    verdict = time_to_target(phases, [ev(5, 0.9, 3)], METRIC, 0.5)
    assert verdict.task_seconds == 0.5 * 3.0 / 4.0 + 0.25
    assert verdict.task_seconds <= verdict.by_phase["eval"]
