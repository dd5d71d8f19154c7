"""Targets on task metrics: the recipe's rules, their direction and the interval rule."""

from __future__ import annotations

import pytest

from ledgerlm.config import RecipeError, recipe_from_dict
from ledgerlm.ledger.target import higher_is_better, holds, meets, time_to_target
from ledgerlm.train.stopping import Patience

ARITH = {"name": "arith", "builtin": "arith"}
CODE = {"name": "cq", "path": "cq.jsonl", "kind": "choice"}


def _eval(**section):
    return recipe_from_dict({"name": "t", "eval": section}).eval


def test_a_task_metric_is_the_target_with_its_threshold_from_targets():
    cfg = _eval(
        tasks=[ARITH, CODE],
        metric="task/cq/acc_norm",
        targets={"task/cq/acc_norm": 0.4, "task/arith/exact_match": 0.2, "code": 3.0},
        confirm_by="interval",
    )
    assert cfg.target() == ("task/cq/acc_norm", 0.4, "accuracy")
    contract = cfg.contract()
    assert contract["confirm_by"] == "interval"
    assert [t["name"] for t in contract["tasks"]] == ["arith", "cq"]
    assert contract["targets"]["task/arith/exact_match"] == 0.2


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ({"targets": {"task/nope/acc": 0.5}}, "no task 'nope' in eval.tasks"),
        ({"tasks": [ARITH], "targets": {"task/arith/acc": 0.5}}, "not acc"),
        ({"tasks": [CODE], "targets": {"bpb/code": 1.0}}, "a domain name or task/"),
        ({"tasks": [CODE], "metric": "task/cq/acc"}, "give its threshold in eval.targets"),
        ({"tasks": [CODE, CODE]}, "given twice"),
        ({"tasks": [CODE], "targets": {"task/cq/acc": 25.0}}, "an accuracy is at most 1"),
        (
            {"tasks": [CODE], "targets": {"task/cq/acc": 1.0}, "confirm_by": "interval"},
            "could never hold",
        ),
        ({"tasks": [{"name": "x", "path": "x.jsonl"}]}, "needs its kind"),
        ({"tasks": [{"name": "x", "path": "x.jsonl", "builtin": "arith"}]}, "exactly one"),
        (
            {"tasks": [{"name": "x", "builtin": "arith", "kind": "choice"}]},
            "is of kind exact or bpb, not choice",
        ),
        ({"tasks": [{"name": "a b", "builtin": "arith"}]}, "task name"),
        (
            {
                "tasks": [CODE],
                "metric": "task/cq/acc",
                "targets": {"task/cq/acc": 0.5},
                "project": True,
            },
            "not with a task metric",
        ),
    ],
)
def test_a_task_target_that_cannot_be_judged_is_refused_in_one_line(section, said):
    with pytest.raises(RecipeError) as err:
        _eval(**section)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_accuracies_hold_at_least_their_threshold_and_losses_at_most():
    assert higher_is_better("task/cq/acc") and higher_is_better("task/arith/exact_match")
    assert not higher_is_better("task/x/bpb") and not higher_is_better("loss/acc")
    m = {"task/cq/acc": 0.5, "task/x/bpb": 1.2, "loss": 3.0}
    assert holds(m, "task/cq/acc", 0.5) and not holds(m, "task/cq/acc", 0.51)
    assert holds(m, "task/x/bpb", 1.2) and not holds(m, "task/x/bpb", 1.19)
    assert holds(m, "loss", 3.0) and not holds(m, "loss", 2.9)
    assert not holds(m, "task/missing/acc", 0.1)  # a missing metric never holds
    assert not holds({"task/cq/acc": float("inf")}, "task/cq/acc", 0.1)


def test_the_interval_rule_judges_a_task_by_the_far_end_of_its_interval():
    m = {
        "loss": 3.0,
        "task/cq/acc": 0.6,
        "task/cq/acc_low": 0.45,
        "task/x/bpb": 1.0,
        "task/x/bpb_high": 1.3,
    }
    targets = {"task/cq/acc": 0.5}
    assert meets(m, "loss", 3.5, targets)
    assert not meets(m, "loss", 3.5, targets, "interval")  # 0.45 < 0.5
    assert meets(m, "loss", 3.5, {"task/cq/acc": 0.45}, "interval")
    assert holds(m, "task/x/bpb", 1.1) and not holds(m, "task/x/bpb", 1.1, "interval")
    # the loss itself has no interval: the rule leaves it to its value
    assert holds(m, "loss", 3.0, "interval")


def test_time_to_target_confirms_only_when_every_task_target_holds():
    phases = [{"id": i, "kind": "train", "seconds": 1.0} for i in range(1, 5)]
    evals = [
        {
            "step": 10 * i,
            "phase_id": i,
            "metrics": {"loss": 2.0, "task/cq/acc": a, "task/cq/acc_low": a - 0.1},
        }
        for i, a in enumerate([0.3, 0.55, 0.65], start=1)
    ]
    plain = time_to_target(phases, evals, "loss", 2.5, 1, {"task/cq/acc": 0.5})
    assert (plain.step, plain.seconds) == (20, 2.0)
    strict = time_to_target(phases, evals, "loss", 2.5, 1, {"task/cq/acc": 0.5}, "interval")
    assert (strict.step, strict.seconds) == (30, 3.0)


def test_patience_on_an_accuracy_counts_a_rise_as_an_improvement():
    history = [
        {"step": 100 * i, "metrics": {"task/cq/acc": a}}
        for i, a in enumerate([0.3, 0.4, 0.5, 0.6], start=1)
    ]
    rule = Patience("task/cq/acc", 2)
    assert rule(history[-1], history) is None
    flat = [*history, *({"step": s, "metrics": {"task/cq/acc": 0.55}} for s in (500, 600))]
    stop = rule(flat[-1], flat)
    assert stop is not None and stop.detail["best"] == 0.6 and stop.detail["best_step"] == 400
