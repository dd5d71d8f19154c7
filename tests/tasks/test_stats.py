"""Task metrics' standard errors and intervals against closed forms: the harness's
mean_stderr, Wilson's interval by hand and at its known values, and a seeded bootstrap
of a ratio of sums."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ledgerlm.tasks.stats import DRAWS, Z95, accuracy, bootstrap, wilson


def test_accuracy_is_the_mean_with_the_harness_stderr():
    values = [1, 0, 1, 1, 0, 1, 1, 1]
    got = accuracy(values, "task/t/acc")
    n, mean = len(values), sum(values) / len(values)
    stderr = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) / math.sqrt(n)
    assert got["task/t/acc"] == mean
    assert got["task/t/acc_stderr"] == pytest.approx(stderr, rel=1e-12)
    assert set(got) == {f"task/t/acc{s}" for s in ("", "_stderr", "_low", "_high")}
    assert set(accuracy(values)) == {"", "_stderr", "_low", "_high"}  # suffixes to prefix


def test_wilson_interval_by_hand():
    # 5 of 10: centre 0.5, half z sqrt(p q / n + z^2 / 4n^2) / (1 + z^2 / n)
    z2 = Z95**2
    half = Z95 * math.sqrt(0.25 / 10 + z2 / 400) / (1 + z2 / 10)
    assert wilson(5, 10) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-12)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # published value
    # none and all of n: one end at the bound, the other z^2 / (n + z^2) away
    assert wilson(0, 10) == pytest.approx((0.0, z2 / (10 + z2)), abs=1e-12)
    assert wilson(10, 10) == pytest.approx((10 / (10 + z2), 1.0), abs=1e-12)
    assert wilson(0, 10)[1] == pytest.approx(0.2775, abs=1e-4)
    got = accuracy([1, 1, 0, 1], "a")
    assert (got["a_low"], got["a_high"]) == pytest.approx(wilson(3, 4), rel=1e-12)
    assert got["a_low"] < 0.75 < got["a_high"]


def test_one_item_has_no_standard_error_and_bad_scores_are_refused():
    one = accuracy([1], "a")
    assert one["a"] == 1.0 and math.isnan(one["a_stderr"])  # the harness prints N/A
    assert (one["a_low"], one["a_high"]) == pytest.approx(wilson(1, 1))
    with pytest.raises(ValueError, match="at least one item"):
        accuracy([])
    with pytest.raises(ValueError, match="must be 0 or 1"):
        accuracy([0.5, 1])


def test_bits_per_byte_is_a_ratio_of_sums_with_a_seeded_bootstrap():
    rng = np.random.default_rng(5)
    nats = rng.uniform(1, 20, 30)
    nbytes = rng.integers(1, 12, 30).astype(float)
    got = bootstrap(nats, nbytes, "b")
    assert got["b"] == pytest.approx(nats.sum() / nbytes.sum() / math.log(2), rel=1e-12)
    # the draws by hand: DRAWS resamples of the items from default_rng(0)
    idx = np.random.default_rng(0).integers(0, 30, size=(DRAWS, 30))
    ratios = nats[idx].sum(1) / nbytes[idx].sum(1) / math.log(2)
    assert got["b_stderr"] == pytest.approx(ratios.std(ddof=1), rel=1e-12)
    assert (got["b_low"], got["b_high"]) == pytest.approx(tuple(np.percentile(ratios, [2.5, 97.5])))
    assert got["b_low"] < got["b"] < got["b_high"]
    assert bootstrap(nats, nbytes, "b") == got  # seeded: the same items, the same interval


def test_the_bootstrap_of_equal_ratios_has_no_spread_and_bad_input_is_refused():
    got = bootstrap([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], "b")
    assert got["b_stderr"] == pytest.approx(0, abs=1e-12)
    assert got["b_low"] == pytest.approx(got["b"]) == pytest.approx(got["b_high"])
    with pytest.raises(ValueError, match="one nats and one bytes figure per item"):
        bootstrap([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="at least one byte"):
        bootstrap([1.0], [0.0])
