"""The confirmation rule of time-to-target, on plain rows (no database)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerlm.ledger import TimeToTarget, time_to_target


def _run(segments: list[tuple[float, float, float | None]]) -> tuple[list[dict], list[dict]]:
    """Rows for a run of (train seconds, eval seconds, val_loss) segments, 100 steps each."""
    phases: list[dict] = []
    evaluations: list[dict] = []
    for i, (train_s, eval_s, loss) in enumerate(segments):
        phases.append({"id": len(phases) + 1, "kind": "train", "seconds": train_s})
        phases.append({"id": len(phases) + 1, "kind": "eval", "seconds": eval_s})
        metrics = {} if loss is None else {"val_loss": loss}
        evaluations.append({"step": (i + 1) * 100, "metrics": metrics, "phase_id": len(phases)})
    return phases, evaluations


def test_first_confirming_eval_bounds_the_bill() -> None:
    phases, evals = _run([(10.0, 1.0, 4.0), (10.0, 1.0, 2.5), (10.0, 1.0, 2.0)])
    result = time_to_target(phases, evals, "val_loss", 3.0)
    assert result.reached
    assert result.step == 200
    assert result.seconds == pytest.approx(22.0)
    assert result.by_phase == pytest.approx({"train": 20.0, "eval": 2.0})
    assert result.evaluation is not None and result.evaluation["step"] == 200
    assert result.describe() == "target reached at step 200 after 22.0 s"
    assert json.loads(json.dumps(result.to_dict()))["status"] == "reached"


def test_threshold_is_inclusive() -> None:
    phases, evals = _run([(5.0, 1.0, 3.0)])
    assert time_to_target(phases, evals, "val_loss", 3.0).step == 100


def test_never_met_is_not_reached() -> None:
    phases, evals = _run([(10.0, 1.0, 4.0), (10.0, 1.0, 3.5)])
    result = time_to_target(phases, evals, "val_loss", 3.0)
    assert result == TimeToTarget(False, None, None, {}, None, "val_loss", 3.0)
    assert result.describe() == "target NOT reached"
    out = result.to_dict()
    assert out["reached"] is False
    assert out["status"] == "not reached"
    assert out["seconds"] is None


@pytest.mark.parametrize("bad", [math.nan, -math.inf, None])
def test_nan_missing_or_infinite_metric_never_confirms(bad: float | None) -> None:
    phases, evals = _run([(10.0, 1.0, bad), (10.0, 1.0, 2.0)])
    if bad is not None:
        evals[0]["metrics"] = {"val_loss": bad}
    result = time_to_target(phases, evals, "val_loss", 3.0)
    assert result.step == 200
    assert result.seconds == pytest.approx(22.0)


def test_only_nan_is_not_reached() -> None:
    phases, evals = _run([(10.0, 1.0, math.nan)])
    assert not time_to_target(phases, evals, "val_loss", 3.0).reached


def test_other_metric_is_ignored() -> None:
    phases, evals = _run([(10.0, 1.0, 2.0)])
    assert not time_to_target(phases, evals, "accuracy_loss", 3.0).reached


def test_open_phase_counts_as_zero_and_steps_decide_order() -> None:
    phases = [
        {"id": 1, "kind": "prep", "seconds": None},
        {"id": 2, "kind": "train", "seconds": 7.0},
        {"id": 3, "kind": "eval", "seconds": 1.0},
        {"id": 4, "kind": "train", "seconds": 7.0},
        {"id": 5, "kind": "eval", "seconds": 1.0},
    ]
    evals = [  # given out of order: the later one would also confirm
        {"step": 20, "metrics": {"val_loss": 1.0}, "phase_id": 5},
        {"step": 10, "metrics": {"val_loss": 2.0}, "phase_id": 3},
    ]
    result = time_to_target(phases, evals, "val_loss", 3.0)
    assert (result.step, result.seconds) == (10, 8.0)
    assert result.by_phase == {"prep": 0.0, "train": 7.0, "eval": 1.0}


_segment = st.tuples(
    st.floats(0.0, 1e4, allow_nan=False),
    st.floats(0.0, 1e3, allow_nan=False),
    st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 10.0)),
)


@given(segments=st.lists(_segment, min_size=1, max_size=12), data=st.data())
def test_property_sum_up_to_first_confirming_eval(segments: list, data: st.DataObject) -> None:
    threshold = 5.0
    phases, evals = _run(segments)
    result = time_to_target(phases, data.draw(st.permutations(evals)), "val_loss", threshold)

    cumulative: list[float] = []
    running = 0.0
    for train_s, eval_s, _ in segments:
        running += train_s + eval_s
        cumulative.append(running)
    hits = [
        i
        for i, (_, _, loss) in enumerate(segments)
        if loss is not None and not math.isnan(loss) and loss <= threshold
    ]
    if not hits:
        assert not result.reached and result.seconds is None
        return
    first = hits[0]
    assert result.step == (first + 1) * 100
    assert result.seconds == pytest.approx(cumulative[first])
    assert sum(result.by_phase.values()) == pytest.approx(result.seconds)
    slack = 1e-9 * max(1.0, cumulative[-1])  # by_phase sums in a different order
    for later in cumulative[first:]:
        assert result.seconds <= later + slack
    for earlier in cumulative[:first]:
        assert result.seconds >= earlier - slack


def test_confirmation_needs_consecutive_evaluations() -> None:
    # A lucky dip at step 200 is not confirmed by 2 consecutive evaluations; 400 and 500 are.
    losses = [4.0, 2.9, 3.2, 2.8, 2.7, 2.6]
    phases, evals = _run([(10.0, 1.0, x) for x in losses])
    assert time_to_target(phases, evals, "val_loss", 3.0).step == 200
    two = time_to_target(phases, evals, "val_loss", 3.0, confirm=2)
    assert two.step == 500 and two.seconds == pytest.approx(55.0)
    assert time_to_target(phases, evals, "val_loss", 3.0, confirm=3).step == 600
    assert not time_to_target(phases, evals, "val_loss", 3.0, confirm=5).reached
    with pytest.raises(ValueError):
        time_to_target(phases, evals, "val_loss", 3.0, confirm=0)


def test_per_domain_targets_must_all_be_met() -> None:
    """eval.targets: the metric and every listed domain at or below its own threshold."""
    phases, evals = [], []
    curve = [  # loss, loss/code, loss/math at steps 100, 200, 300
        (2.9, 3.3, 2.3),  # average met, code not
        (2.8, 3.05, 2.5),  # code met, math not
        (2.7, 3.0, 2.4),  # every one met (inclusive)
    ]
    for i, (avg, code, math_) in enumerate(curve):
        phases.append({"id": 2 * i + 1, "kind": "train", "seconds": 10.0})
        phases.append({"id": 2 * i + 2, "kind": "eval", "seconds": 1.0})
        metrics = {"loss": avg, "loss/code": code, "loss/math": math_}
        evals.append({"step": (i + 1) * 100, "metrics": metrics, "phase_id": 2 * i + 2})
    plain = time_to_target(phases, evals, "loss", 3.0)
    assert plain.step == 100
    targets = {"code": 3.1, "math": 2.4}
    both = time_to_target(phases, evals, "loss", 3.0, targets=targets)
    assert both.step == 300 and both.seconds == pytest.approx(33.0)
    assert both.to_dict()["targets"] == targets
    # a domain with no measurement never confirms
    missing = time_to_target(phases, evals, "loss", 3.0, targets={"web": 9.0})
    assert not missing.reached


def test_a_verdict_reads_back_from_its_json_form() -> None:
    """A run summary holds ``to_dict``'s form; ``from_dict`` gives the same verdict back,
    per-domain targets included, and an older summary without targets reads as none."""
    phases, evals = _run([(10.0, 1.0, 3.5), (10.0, 1.0, 2.9)])
    for verdict in (
        time_to_target(phases, evals, "loss", 3.0, targets={"code": 9.0}),
        time_to_target(phases, evals, "loss", 1.0),
    ):
        assert TimeToTarget.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
    older = time_to_target(phases, evals, "loss", 3.0).to_dict()
    del older["targets"]
    assert TimeToTarget.from_dict(older).targets == {}
