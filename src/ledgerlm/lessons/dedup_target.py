"""The dedup-target lesson: exact dedup moves the squared-error optimum unless weights
preserve it (requirement D5)."""

from __future__ import annotations

from fractions import Fraction

from ledgerlm.lessons.checks import Checks, Expected, LessonResult, fmt
from ledgerlm.lessons.squared_error import gradient_at

# Requirement D5: "targets y=[0,0,2]: uniform mean 2/3; after dedup
# [0,2] uniform mean 1; weights 2/3 and 1/3 restore 2/3. For squared error, the
# optimum moves." The gradients follow: the squared-error objective of the raw records
# has gradient c - 2/3, so 0 at 2/3 and 1/3 at the rebalanced optimum 1.
DEDUP_TARGET = {
    "kept_targets": [0, 2],
    "cluster_sizes": [2, 1],
    "uniform_mean": Fraction(2, 3),
    "dedup_uniform_mean": Fraction(1),
    "preserve_weights": [Fraction(2, 3), Fraction(1, 3)],
    "preserve_mean": Fraction(2, 3),
    "raw_gradient_at_preserved": Fraction(0),
    "raw_gradient_at_rebalanced": Fraction(1, 3),
}


def dedup_target(expected: Expected | None = None) -> LessonResult:
    """Exact dedup of three records whose scalar targets are y = [0, 0, 2], the first two
    being one text: uniform over what is kept moves the squared-error optimum from 2/3
    to 1; weights = cluster size restore 2/3."""
    import numpy as np

    from ledgerlm.data.budget import dedup_weights, weighted_mean
    from ledgerlm.data.dedup import exact_keepers, keeper_rank
    from ledgerlm.data.shingles import word_digests

    checks = Checks(DEDUP_TARGET, expected)
    texts = ["The cat sleeps.", "the cat  SLEEPS.", "Rain stopped."]  # 0 and 1: one text
    y = np.array([0.0, 0.0, 2.0])
    digests = word_digests(texts)  # the key the data stage groups exact duplicates by
    keepers = exact_keepers(
        digests.reshape(len(texts), 2), keeper_rank("first", [0] * 3, [None] * 3)
    )
    kept = np.unique(keepers)
    sizes = np.bincount(keepers, minlength=len(texts))[kept]
    kept_y = y[kept]

    uniform = weighted_mean(y)
    rebalanced_w = dedup_weights(sizes, "rebalance")
    preserved_w = dedup_weights(sizes, "preserve")
    rebalanced = weighted_mean(kept_y, rebalanced_w)
    preserved = weighted_mean(kept_y, preserved_w)
    grad_preserved = gradient_at(preserved, y.tolist())
    grad_rebalanced = gradient_at(rebalanced, y.tolist())

    lines = [
        f"records {texts!r} with targets y = {fmt(y.tolist())}",
        checks.equal("kept_targets", "exact dedup keeps targets", kept_y.tolist()).line(),
        checks.equal("cluster_sizes", "cluster sizes of the kept records", sizes.tolist()).line(),
        checks.equal("uniform_mean", "uniform mean over the raw records", uniform).line(),
        checks.equal(
            "dedup_uniform_mean", "uniform mean after dedup (rebalance)", rebalanced
        ).line(),
        checks.equal(
            "preserve_weights", "weights = cluster size (preserve)", preserved_w.tolist()
        ).line(),
        checks.equal("preserve_mean", "weighted mean after dedup (preserve)", preserved).line(),
        checks.equal(
            "raw_gradient_at_preserved",
            "gradient of the raw squared error at the preserved optimum",
            grad_preserved,
        ).line(),
        checks.equal(
            "raw_gradient_at_rebalanced",
            "gradient of the raw squared error at the rebalanced optimum",
            grad_rebalanced,
        ).line(),
        f"-> rebalancing trains another target: its optimum {fmt(rebalanced)} is not the raw "
        f"records' {fmt(uniform)}; weights = cluster size keep it",
    ]
    return LessonResult(
        "dedup-target",
        "Dedup changes the target unless weights preserve it",
        "requirement D5",
        lines,
        checks.items,
        {
            "targets": y.tolist(),
            "kept_targets": kept_y.tolist(),
            "cluster_sizes": sizes.tolist(),
            "uniform_mean": uniform,
            "rebalance_weights": rebalanced_w.tolist(),
            "rebalance_mean": rebalanced,
            "preserve_weights": preserved_w.tolist(),
            "preserve_mean": preserved,
            "raw_gradient_at_preserved": grad_preserved,
            "raw_gradient_at_rebalanced": grad_rebalanced,
        },
    )
