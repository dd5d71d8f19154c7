"""The recommended mixture: the mean of the best candidates drawn around a center."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ledgerlm.mixture import recommend as recommend_module
from ledgerlm.mixture.recommend import recommend, weak_fit, weak_search


def test_recommend_averages_the_best_of_every_candidate_it_scored(monkeypatch):
    monkeypatch.setattr(recommend_module, "RECOMMEND_CHUNK", 37)  # several chunks, one partial
    target = np.array([0.6, 0.3, 0.1])
    seen = []

    def distance(w):
        seen.append(w.copy())
        return np.abs(w - target).sum(axis=1)

    best = recommend(distance, np.full(3, 1 / 3), 3.0, candidates=200, top_k=10, seed=5)
    scored = np.concatenate(seen)
    assert len(scored) == 200 and max(len(s) for s in seen) <= 37
    brute = scored[np.argsort(distance(scored), kind="stable")[:10]].mean(axis=0)
    np.testing.assert_allclose(best, brute / brute.sum(), atol=1e-12)
    assert best.sum() == pytest.approx(1.0, abs=1e-12)
    again = recommend(distance, np.full(3, 1 / 3), 3.0, candidates=200, top_k=10, seed=5)
    np.testing.assert_array_equal(best, again)


def test_recommend_with_fewer_candidates_than_top_k_and_zero_domains():
    best = recommend(lambda w: w[:, 0], np.array([0.5, 0.5, 0.0]), 5.0, candidates=7, top_k=100)
    assert best[2] == 0 and best.sum() == pytest.approx(1.0)


def test_a_fit_is_weak_evidence_below_16_rows_or_a_spearman_of_0_5():
    assert weak_fit(16, 0.5) is None
    assert weak_fit(15, 0.9) == "only 15 rows (< 16): the recommended mixture is weak evidence"
    assert weak_fit(40, 0.49) == (
        "the cross-validated Spearman is 0.49 (< 0.5): the recommended mixture is weak evidence"
    )
    assert weak_fit(3, math.nan) == (
        "the cross-validated Spearman is undefined (constant predictions) and only 3 rows "
        "(< 16): the recommended mixture is weak evidence"
    )


def test_a_search_is_weak_evidence_with_the_same_bounds():
    assert weak_search(16, {"loss": 0.5, "loss/code": 0.9}) is None
    assert weak_search(15, {"loss": 0.9}) == []  # too few trials, every ranking good
    assert weak_search(16, {"loss": 0.49, "loss/code": None, "loss/math": 0.7}) == [
        "loss",
        "loss/code",
    ]  # None: an undefined Spearman
