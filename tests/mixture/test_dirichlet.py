"""Dirichlet draws of mixtures around a center and the concentration estimate."""

from __future__ import annotations

import numpy as np
import pytest

from ledgerlm.mixture import dirichlet
from ledgerlm.mixture.dirichlet import concentration_of, dirichlet_around


def test_dirichlet_rows_are_mixtures_deterministic_per_seed_and_keep_zero_domains():
    center = np.array([0.5, 0.0, 0.3, 0.2, 0.0])
    w = dirichlet_around(center, 10.0, 2_000, seed=7)
    assert w.shape == (2_000, 5)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(w >= 0)
    assert np.all(w[:, [1, 4]] == 0)
    np.testing.assert_array_equal(w, dirichlet_around(center, 10.0, 2_000, seed=7))
    assert not np.array_equal(w, dirichlet_around(center, 10.0, 2_000, seed=8))
    np.testing.assert_allclose(w.mean(axis=0), center, atol=0.01)
    # an unnormalised center is the same center
    np.testing.assert_array_equal(w, dirichlet_around(2 * center, 10.0, 2_000, seed=7))


def test_dirichlet_with_one_live_domain_or_a_tiny_concentration():
    np.testing.assert_array_equal(
        dirichlet_around(np.array([0.0, 1.0, 0.0]), 5.0, 3, seed=0), [[0, 1, 0]] * 3
    )
    w = dirichlet_around(np.full(6, 1 / 6), 1e-3, 500, seed=0)  # mass piles on corners
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("bad", [np.array([0.5, -0.1, 0.6]), np.zeros(3), np.array([np.nan, 1])])
def test_dirichlet_refuses_a_bad_center(bad):
    with pytest.raises(ValueError, match="center"):
        dirichlet_around(bad, 5.0, 3, seed=0)
    with pytest.raises(ValueError, match="concentration"):
        dirichlet_around(np.array([0.5, 0.5]), 0.0, 3, seed=0)


@pytest.mark.parametrize("s", [3.0, 20.0, 150.0])
def test_concentration_of_recovers_a_known_concentration_within_20_percent(s):
    center = np.array([0.35, 0.25, 0.2, 0.1, 0.06, 0.04])
    w = dirichlet_around(center, s, 5_000, seed=int(s))
    assert concentration_of(w) == pytest.approx(s, rel=0.2)


def test_concentration_of_falls_back_when_rows_do_not_determine_it():
    k = 4
    fallback = dirichlet.FALLBACK_CONCENTRATION_PER_DOMAIN * k
    assert concentration_of(np.full((1, k), 0.25)) == fallback
    assert concentration_of(np.full((10, k), 0.25)) == fallback  # no variance
    lo, hi = dirichlet.CONCENTRATION_RANGE
    assert lo <= concentration_of(np.eye(k)[[0, 1, 2, 3] * 3]) <= hi  # corners: widest
