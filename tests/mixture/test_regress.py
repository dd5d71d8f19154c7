"""The mixture regression (RegMix style): the cross-validated fit from mixture weights
to a result, and the mixture it recommends."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ledgerlm.mixture.dirichlet import concentration_of, dirichlet_around
from ledgerlm.mixture.recommend import recommend
from ledgerlm.mixture.regress import fit_regression, spearman

# The smooth loss of the synthetic tables: sum_i a_i * -log(w_i + EPS). On the simplex
# its minimum is at w_i = (1 + k EPS) a_i - EPS, within 0.004 of a.
A = np.array([0.4, 0.3, 0.2, 0.1])
EPS = 1e-3
OPTIMUM = (1 + A.size * EPS) * A - EPS
# max |recommended_i - optimum_i| over the domains: boosted trees on 200 rows resolve the
# minimum to a few hundredths (0.004 to 0.044 over 8 seeds of this table); the table's
# mean mixture (uniform) is 0.15 away.
RECOMMEND_TOLERANCE = 0.06


def smooth_loss(w: np.ndarray) -> np.ndarray:
    return -(np.log(w + EPS) * A).sum(axis=1)


@pytest.fixture(scope="module")
def smooth_table():
    w = dirichlet_around(np.full(4, 0.25), 3.0, 200, seed=1)
    return w, smooth_loss(w)


def test_lightgbm_learns_a_smooth_loss_and_recommends_near_its_minimum(smooth_table):
    w, y = smooth_table
    reg = fit_regression(w, y, list("abcd"))
    assert reg.model == "lightgbm"  # auto: 200 rows >= 32
    assert reg.cv.folds == 5 and reg.cv.predictions.shape == (200,)
    assert reg.cv.spearman > 0.9
    assert reg.cv.rmse >= reg.cv.mae > 0
    best = recommend(reg.predict, w.mean(axis=0), concentration_of(w), candidates=20_000)
    assert best.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.max(np.abs(best - OPTIMUM)) < RECOMMEND_TOLERANCE, best
    # its true loss is within 1% of the table's range of the true minimum
    excess = smooth_loss(best[None, :])[0] - smooth_loss(OPTIMUM[None, :])[0]
    assert 0 <= excess < 0.01 * np.ptp(y)


def test_the_fit_is_deterministic_for_a_seed(smooth_table):
    w, y = smooth_table
    one = fit_regression(w[:80], y[:80], list("abcd"), seed=3)
    two = fit_regression(w[:80], y[:80], list("abcd"), seed=3)
    np.testing.assert_array_equal(one.cv.predictions, two.cv.predictions)
    np.testing.assert_array_equal(one.predict(w), two.predict(w))
    other = fit_regression(w[:80], y[:80], list("abcd"), seed=4)  # other folds
    assert not np.array_equal(one.cv.predictions, other.cv.predictions)


def test_linear_fits_an_exactly_linear_target_on_a_handful_of_rows():
    w = dirichlet_around(np.array([0.5, 0.3, 0.2]), 5.0, 10, seed=3)
    y = w @ np.array([2.0, 3.0, 5.0])
    reg = fit_regression(w, y, ["web", "code", "math"])
    assert reg.model == "linear"  # auto: 10 rows < 32
    assert reg.cv.spearman > 0.99
    assert reg.cv.mae < 1e-3 * np.ptp(y)
    np.testing.assert_allclose(reg.cv.predictions, y, atol=1e-3 * np.ptp(y))  # row order
    np.testing.assert_allclose(reg.predict(w), y, atol=1e-3 * np.ptp(y))
    # the recommendation of a linear loss is its cheapest corner side: mostly "web"
    best = recommend(reg.predict, w.mean(axis=0), concentration_of(w), candidates=5_000)
    assert np.argmax(best) == 0 and best[0] > w.mean(axis=0)[0]


def test_folds_are_capped_by_the_rows_leave_one_out_below():
    w = dirichlet_around(np.full(3, 1 / 3), 5.0, 4, seed=0)
    y = w @ np.array([1.0, 2.0, 3.0])
    assert fit_regression(w, y, list("abc"), folds=5).cv.folds == 4
    assert fit_regression(w, y, list("abc"), folds=2).cv.folds == 2
    w40 = dirichlet_around(np.full(3, 1 / 3), 5.0, 40, seed=0)
    reg = fit_regression(w40, w40 @ np.array([1.0, 2.0, 3.0]), list("abc"), model="linear")
    assert reg.model == "linear" and reg.cv.folds == 5


def test_a_constant_target_has_no_spearman_and_its_summary_is_json():
    w = dirichlet_around(np.full(3, 1 / 3), 5.0, 8, seed=0)
    reg = fit_regression(w, np.full(8, 2.5), list("abc"))
    assert math.isnan(reg.cv.spearman) and reg.cv.mae == pytest.approx(0, abs=1e-12)
    summary = reg.to_dict()
    json.dumps(summary, allow_nan=False)
    assert summary["cv"]["spearman"] is None
    assert summary["rows"] == 8 and summary["domains"] == ["a", "b", "c"]
    assert set(summary) == {"model", "domains", "rows", "settings", "cv"}


def test_fit_regression_refuses_what_it_cannot_fit():
    w = dirichlet_around(np.full(3, 1 / 3), 5.0, 6, seed=0)
    y = w[:, 0]
    with pytest.raises(ValueError, match="at least 3 rows"):
        fit_regression(w[:2], y[:2], list("abc"))
    with pytest.raises(ValueError, match="unknown model"):
        fit_regression(w, y, list("abc"), model="forest")
    with pytest.raises(ValueError, match="2 folds"):
        fit_regression(w, y, list("abc"), folds=1)
    with pytest.raises(ValueError, match="domain names"):
        fit_regression(w, y, list("ab"))
    with pytest.raises(ValueError, match="finite"):
        fit_regression(w, np.r_[y[:-1], np.nan], list("abc"))
    reg = fit_regression(w, y, list("abc"))
    with pytest.raises(ValueError, match="3 domains"):
        reg.predict(np.ones((2, 4)) / 4)


@pytest.mark.parametrize("seed", range(5))
def test_spearman_matches_scipy_with_ties(seed):
    from scipy.stats import spearmanr

    rng = np.random.default_rng(seed)
    a = rng.integers(0, 6, 40).astype(float)  # many ties
    b = a + rng.normal(0, 2, 40).round()
    assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    assert math.isnan(spearman(a, np.ones(40)))
