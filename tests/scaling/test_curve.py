"""The validation curve over tokens, L(D) = E + A D^-alpha (scaling.curve), and the
``eval.project`` rule that stops a run whose fitted curve misses its target at the budget."""

from __future__ import annotations

import numpy as np
import pytest

from ledgerlm.scaling import curve
from ledgerlm.scaling.curve import fit_curve, project
from ledgerlm.train.stopping import Projected

E, A, ALPHA = 3.0, 300.0, 0.5
BUDGET = 204_800  # tokens: 200 updates of 1,024


def law(tokens):
    return E + A * np.asarray(tokens, dtype=np.float64) ** -ALPHA


def history(n: int, noise: float = 0.01, seed: int = 3, every: int = 10_240) -> list[dict]:
    """``n`` evaluations every ``every`` tokens on the known law, with a log-normal noise."""
    tokens = every * np.arange(1, n + 1)
    loss = law(tokens) * np.exp(np.random.default_rng(seed).normal(0, noise, n))
    return [
        {"step": 10 * (i + 1), "tokens": int(d), "metrics": {"loss": float(v)}}
        for i, (d, v) in enumerate(zip(tokens, loss, strict=True))
    ]


def _ask(rule: Projected, evaluations: list[dict]):
    return rule(evaluations[-1], evaluations)


def test_the_fit_recovers_a_known_curve_from_exact_points():
    tokens = 10_240 * np.arange(1, 9)
    fit = fit_curve(tokens, law(tokens))
    assert fit.converged and fit.n == 8
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((E, A, ALPHA), rel=1e-4)
    found = project(tokens, law(tokens), BUDGET)
    # Exact points leave no residuals: the interval is the projection itself.
    assert found.converged and found.loss == pytest.approx(float(law(BUDGET)), rel=1e-6)
    assert found.low == pytest.approx(found.loss, rel=1e-6)
    assert found.high == pytest.approx(found.loss, rel=1e-6)


def test_a_curve_that_will_clearly_miss_the_target_stops_with_its_projection():
    evaluations = history(8)
    stop = _ask(Projected("loss", 3.0, BUDGET), evaluations)
    assert stop is not None and (stop.reason, stop.status) == (
        "not reached (projected)",
        "not reached",
    )
    d = stop.detail
    assert (d["metric"], d["threshold"], d["budget_tokens"], d["level"]) == (
        "loss",
        3.0,
        BUDGET,
        0.95,
    )
    low, high = d["interval"]
    assert 3.0 < low <= d["projected"] <= high
    assert low <= float(law(BUDGET)) <= high  # the true loss at the budget is inside
    assert set(d["fit"]) == {"E", "A", "alpha", "n"} and d["fit"]["n"] == 8
    assert d["points"] == [[e["tokens"], e["metrics"]["loss"]] for e in evaluations]


def test_a_curve_that_will_reach_the_target_goes_on():
    evaluations = history(8)
    assert evaluations[-1]["metrics"]["loss"] > 3.8 > float(law(BUDGET))  # not yet, but will
    assert _ask(Projected("loss", 3.8, BUDGET), evaluations) is None


def test_a_curve_too_short_or_too_early_never_stops():
    rule = Projected("loss", 1.0, BUDGET)  # far out of reach
    assert _ask(rule, history(6)) is not None
    assert _ask(rule, history(5)) is None  # 5 evaluations: too few
    # 6 evaluations, the last under a tenth of the budget: too early
    assert _ask(rule, history(6, every=3_000)) is None
    assert _ask(Projected("loss", 1.0, 6 * 10_240), history(6)) is None  # at the budget


def test_a_fit_that_did_not_converge_never_stops(monkeypatch):
    real = curve._minimize

    def failing(*args):
        theta, value, _ = real(*args)
        return theta, value, False

    monkeypatch.setattr(curve, "_minimize", failing)
    evaluations = history(8)
    tokens = [e["tokens"] for e in evaluations]
    assert not project(tokens, [e["metrics"]["loss"] for e in evaluations], BUDGET).converged
    assert _ask(Projected("loss", 3.0, BUDGET), evaluations) is None


def test_a_target_inside_the_interval_goes_on():
    # Projected above the threshold, but the optimistic end of the interval below it.
    evaluations = history(8)
    tokens = [e["tokens"] for e in evaluations]
    found = project(tokens, [e["metrics"]["loss"] for e in evaluations], BUDGET)
    assert found.low < found.loss
    threshold = (found.low + found.loss) / 2
    assert _ask(Projected("loss", threshold, BUDGET), evaluations) is None
    assert _ask(Projected("loss", found.low - 1e-3, BUDGET), evaluations) is not None


def test_the_interval_is_seeded():
    evaluations = history(8)
    tokens = [e["tokens"] for e in evaluations]
    loss = [e["metrics"]["loss"] for e in evaluations]
    first, again, other = (project(tokens, loss, BUDGET, seed=s) for s in (0, 0, 1))
    assert (first.low, first.high) == (again.low, again.high)
    assert (first.low, first.high) != (other.low, other.high)


def test_a_curve_needs_four_positive_points():
    with pytest.raises(ValueError, match="4 points"):
        fit_curve([1, 2, 3], [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="positive"):
        fit_curve([1, 2, 3, 4], [3.0, 2.0, 1.0, 0.0])
