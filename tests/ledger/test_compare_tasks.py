"""Comparing runs on their downstream tasks: the line that says the validation loss
improved while a task did not (direction-aware), and seed groups' mean and spread of
each final metric, on real SQLite ledgers."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ledgerlm.ledger import Ledger
from ledgerlm.ledger.compare import compare_runs
from ledgerlm.ledger.compare_tasks import (
    final_metric_values,
    final_metrics,
    is_task_metric,
    pm,
    task_metric_names,
)
from report.task_ledger import accuracy, bits, task_run


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger(tmp_path / "ledger.db") as led:
        yield led


def recipe(seed: int = 0, lr: float = 1e-3, name: str = "r") -> dict:
    return {"name": name, "train": {"seed": seed, "lr": lr}, "eval": {"every_steps": 100}}


def _run(ledger: Ledger, name: str, loss: float, correct: int, **kw) -> dict:
    """Two evaluations; the last has ``loss`` and ``correct``/100 on task qa."""
    evals = [
        {"loss": loss + 0.5, **accuracy("qa", "acc", 20, 100)},
        {"loss": loss, **accuracy("qa", "acc", correct, 100)},
    ]
    return ledger.run_summary(task_run(ledger, name, kw.pop("recipe", recipe()), evals=evals, **kw))


def test_task_keys_are_told_from_their_stderr_interval_and_items() -> None:
    keys = accuracy("qa", "acc_norm", 3, 10) | bits("b", 1.2, 0.1, 10) | {"loss": 1.0}
    assert [k for k in keys if is_task_metric(k)] == ["task/qa/acc_norm", "task/b/bpb"]
    assert task_metric_names([{"metrics": keys}, {"metrics": {"task/z/exact_match": 1}}]) == [
        "task/qa/acc_norm",
        "task/b/bpb",
        "task/z/exact_match",
    ]


def test_pm_keeps_the_decimals_of_the_stderr() -> None:
    assert pm(0.62, 0.0712) == "0.62±0.07"
    assert pm(1.23456, 0.0012) == "1.235±0.001"
    assert pm(1.0, 0.0) == "1.00±0.00"  # every item right: no spread
    assert pm(0.5, None) == "0.5000"
    assert pm(None, 0.1) == "-"


def test_loss_improved_but_task_did_not_is_one_line_with_both_figures(ledger: Ledger) -> None:
    base = _run(ledger, "base", 1.20, 45)
    worse = _run(ledger, "cand", 1.10, 41)
    result = compare_runs([base, worse])
    (c,) = result["comparisons"]
    check = c["task_check"]
    assert check["metric"] == "loss" and check["improved"] is True
    (task,) = check["tasks"]
    assert task["metric"] == "task/qa/acc" and task["improved"] is False
    assert task["run"] == pytest.approx(0.41) and task["baseline"] == pytest.approx(0.45)
    se = statistics.stdev([1.0] * 41 + [0.0] * 59) / 10  # lm-eval-harness's mean_stderr
    assert task["run_stderr"] == pytest.approx(se)
    line = check["line"]
    assert line.startswith(f"{worse['run']['id']}: val loss improved (1.1000 vs 1.2000")
    assert "task/qa/acc 0.41±0.05 vs 0.45±0.05" in line


def test_no_line_when_the_task_improved_too_or_the_loss_did_not(ledger: Ledger) -> None:
    base = _run(ledger, "base", 1.20, 45)
    both = _run(ledger, "both", 1.10, 50)
    loss_worse = _run(ledger, "lossworse", 1.30, 41)
    result = compare_runs([base, both, loss_worse])
    b, w = result["comparisons"]
    assert b["task_check"]["improved"] is True and b["task_check"]["line"] is None
    assert b["task_check"]["tasks"][0]["improved"] is True
    assert w["task_check"]["improved"] is False and w["task_check"]["line"] is None


def test_an_equal_accuracy_did_not_improve(ledger: Ledger) -> None:
    base = _run(ledger, "base", 1.20, 45)
    same = _run(ledger, "same", 1.10, 45)
    assert compare_runs([base, same])["comparisons"][0]["task_check"]["line"] is not None


def test_bits_per_byte_of_a_task_is_better_lower(ledger: Ledger) -> None:
    def run(name: str, loss: float, bpb: float) -> dict:
        evals = [{"loss": loss, **bits("story", bpb, 0.02, 50)}]
        return ledger.run_summary(task_run(ledger, name, recipe(), evals=evals))

    base, lower, higher = run("base", 1.2, 1.50), run("lower", 1.1, 1.40), run("higher", 1.1, 1.6)
    c_lower, c_higher = compare_runs([base, lower, higher])["comparisons"]
    assert c_lower["task_check"]["line"] is None
    assert "task/story/bpb 1.60±0.02 vs 1.50±0.02" in c_higher["task_check"]["line"]


def test_final_metrics_are_the_last_evaluation_that_measured_each(ledger: Ledger) -> None:
    evals = [
        {"loss": 1.5, **accuracy("qa", "acc", 30, 100)},
        {"loss": 1.2},  # this evaluation scored no task
    ]
    after = [(200, accuracy("qa", "acc", 35, 100), True)]
    summary = ledger.run_summary(task_run(ledger, "r", recipe(), evals=evals, after=after))
    found = final_metrics(summary)
    assert list(found) == ["loss", "task/qa/acc"]
    assert found["loss"] == {"value": 1.2, "stderr": None, "step": 200}
    assert found["task/qa/acc"]["value"] == pytest.approx(0.35)  # the after-the-fact one
    # at the step of one of the run's own evaluations, the run's own figure stands
    again = [(200, accuracy("qa", "acc", 10, 50), True)]
    evals = [{"loss": 1.5}, {"loss": 1.2, **accuracy("qa", "acc", 40, 100)}]
    summary = ledger.run_summary(task_run(ledger, "r2", recipe(), evals=evals, after=again))
    assert final_metrics(summary)["task/qa/acc"]["value"] == pytest.approx(0.40)


def test_seed_groups_hold_mean_and_sample_std_of_each_final_metric(ledger: Ledger) -> None:
    seeds = [
        _run(ledger, f"s{seed}", loss, correct, recipe=recipe(seed=seed, name=f"s{seed}"))
        for seed, loss, correct in ((0, 1.0, 40), (1, 1.1, 44), (2, 1.3, 48))
    ]
    other = _run(ledger, "lr", 0.9, 60, recipe=recipe(lr=3e-3))
    groups = compare_runs([*seeds, other])["seed_groups"]
    assert [g["n"] for g in groups] == [3, 1]
    rows = {m["metric"]: m for m in groups[0]["final_metrics"]}
    assert list(rows) == ["loss", "task/qa/acc"]
    assert rows["loss"]["n"] == 3
    assert rows["loss"]["mean"] == pytest.approx(3.4 / 3)
    # sample std (n - 1): deviations -0.1333, -0.0333, +0.1667
    assert rows["loss"]["std"] == pytest.approx(((0.4 / 3) ** 2 + (0.1 / 3) ** 2 + (0.5 / 3) ** 2)
                                                ** 0.5 / 2**0.5)  # fmt: skip
    assert rows["task/qa/acc"]["mean"] == pytest.approx(0.44)
    assert rows["task/qa/acc"]["std"] == pytest.approx(0.04)
    assert (rows["task/qa/acc"]["min"], rows["task/qa/acc"]["max"]) == pytest.approx((0.4, 0.48))
    assert groups[1]["final_metrics"][1]["std"] is None  # one run: no spread


def test_a_final_metric_is_spread_over_the_runs_that_measured_it() -> None:
    figures = [
        {"final_metrics": {"loss": {"value": 1.0}, "task/qa/acc": {"value": 0.4}}},
        {"final_metrics": {"loss": {"value": 1.2}}},
        {"final_metrics": {"task/story/bpb": {"value": 1.9}, "task/qa/acc": {"value": 0.5}}},
    ]
    assert final_metric_values(figures) == {
        "loss": [1.0, 1.2],
        "task/qa/acc": [0.4, 0.5],
        "task/story/bpb": [1.9],
    }


def test_an_asynchronous_evaluation_s_tasks_count_their_share_of_its_wait():
    from ledgerlm.ledger.compare_tasks import task_seconds

    phases = [
        # scored in the background for 4 s while training waited 0.5 s of it
        {
            "kind": "eval",
            "seconds": 0.5,
            "detail": {"eval_wall_seconds": 4.0, "task_seconds": {"qa": 3.0}},
        },
        {"kind": "eval", "seconds": 2.0, "detail": {"task_seconds": {"qa": 1.5, "ar": 0.25}}},
        {"kind": "train", "seconds": 9.0, "detail": {"task_seconds": {"qa": 7.0}}},
    ]
    found = task_seconds({"phases": phases})
    assert found == {"qa": 0.5 * 3.0 / 4.0 + 1.5, "ar": 0.25}
    assert sum(found.values()) <= sum(p["seconds"] for p in phases if p["kind"] == "eval")


def test_a_runs_final_figures_are_its_own_not_an_evaluation_written_after_the_fact(
    ledger: Ledger,
) -> None:
    """``ledgerlm eval`` writes a tasks-only evaluation at the checkpoint's step, after
    the run's own: the final loss, its domains, a trial's metric and the report's final
    line are still read from the run's own last evaluation."""
    from ledgerlm.lab.tune.trial import final_metric
    from ledgerlm.ledger.compare import final_domain_losses, final_value
    from ledgerlm.ledger.target import last_in_the_run

    evals = [{"loss": 1.5, "loss/code": 1.4}, {"loss": 1.25, "loss/code": 1.1}]
    run = task_run(ledger, "r", evals=evals, after=[(200, accuracy("qa", "acc", 3, 4), False)])
    summary = ledger.run_summary(run)
    assert set(summary["evaluations"][-1]["metrics"]) >= {"task/qa/acc"}  # written last
    assert last_in_the_run(summary)["metrics"]["loss"] == 1.25
    assert final_value(summary) == 1.25
    assert final_domain_losses(summary) == {"code": 1.1}
    assert final_metric(summary, "loss") == 1.25
    (figures,) = compare_runs([summary])["runs"]
    assert figures["final_value"] == 1.25 and figures["final_domains"] == {"code": 1.1}
    # an interrupted run: the checkpoint's step lies past the last evaluation of its own
    later = task_run(ledger, "k", evals=evals, after=[(250, accuracy("qa", "acc", 3, 4), True)])
    assert final_value(ledger.run_summary(later)) == 1.25
    assert last_in_the_run({"phases": [], "evaluations": []}) is None
