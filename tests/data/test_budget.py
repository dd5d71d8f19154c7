import numpy as np
import pytest

from ledgerlm.data.budget import budget, dedup_weights, weighted_mean


def test_seed_d5_dedup_changes_the_target_unless_weights_preserve_it():
    y = [0, 0, 2]
    assert weighted_mean(y) == pytest.approx(2 / 3)  # uniform over the raw records
    kept, sizes = [0, 2], [2, 1]  # after dedup: one 0 (a cluster of two) and one 2
    rebalanced = dedup_weights(sizes, "rebalance")
    preserved = dedup_weights(sizes, "preserve")
    assert weighted_mean(kept, rebalanced) == pytest.approx(1.0)
    assert preserved.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert weighted_mean(kept, preserved) == pytest.approx(2 / 3)


def test_squared_error_optimum_moves_with_the_weights():
    kept, sizes = np.array([0.0, 2.0]), [2, 1]
    grid = np.linspace(-1, 3, 4001)
    for mode in ("rebalance", "preserve"):
        w = dedup_weights(sizes, mode)
        risk = [(w * (kept - c) ** 2).sum() for c in grid]
        assert grid[int(np.argmin(risk))] == pytest.approx(weighted_mean(kept, w), abs=1e-3)


def test_seed_d6_raw_and_unique_tokens():
    lengths = np.full(190, 1000)
    kept = np.arange(190) < 100  # ten of the 100 documents reprinted nine more times
    b = budget(lengths, kept)
    assert (b.raw, b.unique, b.repeats) == (190_000, 100_000, 90_000)
    assert b.exposure == pytest.approx(1.9)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown weights mode"):
        dedup_weights([1], "uniform")
    with pytest.raises(ValueError):
        budget([10], [True, False])
