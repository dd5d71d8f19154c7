"""The teaching checks of requirements E (seed 000, section 08) as a library: every lesson passes
with the project's functions as they are, and fails when the function it exercises
misbehaves or when it is held to a wrong expected value."""

from __future__ import annotations

import json

import pytest

from ledgerlm.lessons.confirm_target import confirm_target
from ledgerlm.lessons.dedup_target import dedup_target
from ledgerlm.lessons.learning_rate import learning_rate
from ledgerlm.lessons.mixture_gradient import mixture_gradient
from ledgerlm.lessons.registry import LESSONS, lesson_names, run_lessons

NAMES = ["dedup-target", "mixture-gradient", "learning-rate", "confirm-target"]


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in run_lessons()}


def test_all_four_lessons_run_and_pass(results):
    assert list(results) == NAMES == lesson_names()
    for r in results.values():
        assert r.passed, "\n".join(r.lines)
        assert r.title and r.source and 3 <= len(r.lines) <= 14
        assert r.checks and all(c.passed for c in r.checks)
    # `ledgerlm lessons --help` gives each lesson one line of an 80-column terminal
    assert all(len(f" {name}: {lesson.summary}") <= 80 for name, lesson in LESSONS.items())


def test_results_are_json_with_the_computed_values(results):
    for r in results.values():
        out = json.loads(json.dumps(r.to_dict(), allow_nan=False))
        assert out["name"] == r.name and out["passed"] is True
        assert [c["passed"] for c in out["checks"]] == [True] * len(r.checks)
    dedup = results["dedup-target"].values
    assert dedup["uniform_mean"] == pytest.approx(2 / 3)
    assert dedup["rebalance_mean"] == pytest.approx(1.0)
    assert dedup["preserve_weights"] == pytest.approx([2 / 3, 1 / 3])
    mix = results["mixture-gradient"].values
    assert mix["natural_weights"] == pytest.approx([0.8, 0.15, 0.05])
    assert mix["heavy_counts"] == pytest.approx([50, 30, 20])
    rate = results["learning-rate"].values
    assert rate["stability_bound"] == pytest.approx(0.5)
    assert rate["good_distance"] < 1e-3 < 10 < rate["large_distance"]
    ledger = results["confirm-target"].values
    assert [ledger[n]["seconds"] for n in "ABCD"] == pytest.approx([2080, 1280, 3360, 1710])
    assert (ledger["D"]["crossing_step"], ledger["D"]["step"]) == (1200, 1500)
    assert ledger["E"]["status"] == "not reached" and ledger["E"]["seconds"] is None


def test_lines_show_the_computed_value_beside_the_expected_one(results):
    text = "\n".join(results["dedup-target"].lines)
    assert "uniform mean over the raw records: 0.6667 (expected 2/3)" in text
    text = "\n".join(results["confirm-target"].lines)
    assert "confirmed at step 1500 after 1710 s (expected step 1500, 1710 s)" in text
    assert "not reached (expected not reached)" in text


@pytest.mark.parametrize(
    ("name", "key", "wrong"),
    [
        ("dedup-target", "dedup_uniform_mean", 2 / 3),  # as if dedup kept the target
        ("mixture-gradient", "heavy_optimum", 0.35),  # as if the mixture did not matter
        ("learning-rate", "stability_bound", 1.0),
        ("confirm-target", "D_step", 1200),  # confirmed where it crossed: the seed's trap
        ("confirm-target", "E_status", "reached"),
    ],
)
def test_a_wrong_expected_value_fails_the_verdict(name, key, wrong):
    result = LESSONS[name].run(expected={key: wrong})
    assert not result.passed
    failed = [c for c in result.checks if not c.passed]
    assert len(failed) == 1 and failed[0].expected == wrong
    assert any(line.startswith("FAIL") for line in result.lines)


def test_an_unknown_expected_key_is_an_error():
    with pytest.raises(ValueError, match="unknown expected value"):
        dedup_target(expected={"median": 1})


def test_dedup_target_fails_when_dedup_weights_ignore_cluster_sizes(monkeypatch):
    import ledgerlm.data.budget as budget

    real = budget.dedup_weights
    monkeypatch.setattr(budget, "dedup_weights", lambda sizes, mode: real(sizes, "rebalance"))
    result = dedup_target()
    assert not result.passed
    assert {c.what for c in result.checks if not c.passed} == {
        "weights = cluster size (preserve)",
        "weighted mean after dedup (preserve)",
        "gradient of the raw squared error at the preserved optimum",
    }


def test_dedup_target_fails_when_the_stage_digest_keeps_case(monkeypatch):
    """The lesson groups records with the digest the data stage groups exact duplicates by
    (``shingles.word_digests``): one that skips normalization splits the first two."""
    import ledgerlm.data.shingles as shingles

    real = shingles.word_digests
    monkeypatch.setattr(
        shingles, "word_digests", lambda texts, normalized=False: real(texts, normalized=True)
    )
    result = dedup_target()
    assert not result.passed
    failed = {c.what for c in result.checks if not c.passed}
    assert {"exact dedup keeps targets", "cluster sizes of the kept records"} <= failed


def test_mixture_gradient_fails_when_the_objective_loses_its_denominator(monkeypatch):
    import ledgerlm.train.loss as loss

    def summed(per_target, loss_mask, objective, empty_rows):
        numerator, _ = loss.objective_terms(per_target, loss_mask, objective, empty_rows)
        return numerator  # a sum, not a mean: the gradient grows with the batch

    monkeypatch.setattr(loss, "objective_loss", summed)
    result = mixture_gradient()
    assert not result.passed
    failed = {c.what for c in result.checks if not c.passed}
    assert "gradient of the natural objective at c = 1.1" in failed


def test_mixture_gradient_fails_when_the_plan_ignores_the_weights(monkeypatch):
    import ledgerlm.mixture.plan as plan

    real = plan.plan_mixture
    monkeypatch.setattr(
        plan, "plan_mixture", lambda pools, weights, budget: real(pools, {"web": 1.0}, budget)
    )
    assert not mixture_gradient().passed


def test_learning_rate_fails_when_the_schedule_shrinks_the_rate(monkeypatch):
    import ledgerlm.train.optim as optim

    real = optim.lr_at
    monkeypatch.setattr(optim, "lr_at", lambda step, cfg, tokens=0: real(step, cfg) / 10)
    result = learning_rate()
    assert not result.passed
    failed = {c.what for c in result.checks if not c.passed}
    assert "lr 0.6: |theta - theta*| after 20 steps" in failed  # it no longer diverges


def test_confirm_target_fails_when_evaluations_are_not_charged(monkeypatch):
    import ledgerlm.ledger.target as target

    real = target.time_to_target

    def train_only(phases, evaluations, *args, **kwargs):
        return real([p for p in phases if p["kind"] != "eval"], evaluations, *args, **kwargs)

    monkeypatch.setattr(target, "time_to_target", train_only)
    result = confirm_target()
    assert not result.passed
    assert sum(not c.passed for c in result.checks) == 4  # A, B, C, D seconds
    assert sum(line.startswith("FAIL") for line in result.lines) == 4


def test_confirm_target_fails_when_a_crossing_between_evaluations_counts(monkeypatch):
    import ledgerlm.ledger.target as target

    real = target.meets

    def lenient(metrics, metric, threshold, targets=None, confirm_by="threshold"):  # slack
        return real(metrics, metric, threshold + 0.3, targets, confirm_by)  # "nearly there"

    monkeypatch.setattr(target, "meets", lenient)
    result = confirm_target()
    assert not result.passed
    assert result.values["D"]["step"] == 1000  # confirmed before the record reached it


def test_run_lessons_selects_in_the_given_order_and_names_the_known_ones():
    picked = run_lessons(["confirm-target", "dedup-target", "confirm-target"])
    assert [r.name for r in picked] == ["confirm-target", "dedup-target"]
    with pytest.raises(ValueError) as err:
        run_lessons(["learning-rate", "nope"])
    assert str(err.value) == (
        "unknown lesson 'nope' (lessons: dedup-target, mixture-gradient, learning-rate, "
        "confirm-target)"
    )
