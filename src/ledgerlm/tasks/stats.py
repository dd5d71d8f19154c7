"""A task metric's value, standard error and 95% interval, from its per-item scores.

Accuracies (``acc``, ``acc_norm``, ``exact_match``) are means of 0/1 item scores. Their
standard error is lm-evaluation-harness's ``mean_stderr`` (sample standard deviation,
ddof = 1, over sqrt(n)), so the two tools print the same figure; it is not defined for
one item (the harness prints "N/A"), and is NaN here. Their interval is the Wilson
score interval, which stays inside [0, 1] and is not empty at 0 or n successes, where
the normal interval ``p +- z se`` collapses to a point; a target judged by the
interval's far end (``eval.confirm_by = "interval"``) then cannot be met by a lucky
handful of items.

Bits per byte is a ratio of sums over items (nats over bytes), not a mean of per-item
ratios, so its spread comes from a bootstrap over items: ``DRAWS`` resamples of the
items with replacement, each giving the ratio of its sums, from a generator seeded 0
(the same items give the same interval); the standard error is the draws' sample
standard deviation (as the harness's ``bootstrap_stderr``), the interval their 2.5 and
97.5 percentiles.

Each function returns the four keys of one metric: ``key`` itself (the value),
``key_stderr``, ``key_low`` and ``key_high``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
DRAWS = 1000
SEED = 0


def keys(key: str, value: float, stderr: float, low: float, high: float) -> dict[str, float]:
    """The four flat metric keys of one metric."""
    return {
        key: float(value),
        f"{key}_stderr": float(stderr),
        f"{key}_low": float(low),
        f"{key}_high": float(high),
    }


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n``."""
    if n < 1:
        raise ValueError("an interval needs at least one item")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy(values: Sequence[float], key: str = "") -> dict[str, float]:
    """Mean, ``mean_stderr`` and Wilson interval of 0/1 item scores (module doc)."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        raise ValueError("an accuracy needs at least one item")
    if not np.all((x == 0) | (x == 1)):
        raise ValueError("accuracy item scores must be 0 or 1")
    mean = float(x.mean())
    stderr = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    low, high = wilson(float(x.sum()), n)
    return keys(key, mean, stderr, low, high)


def bootstrap(nats: Sequence[float], nbytes: Sequence[float], key: str = "") -> dict[str, float]:
    """Bits per byte of items (``sum nats / sum bytes / ln 2``) with its bootstrap
    standard error and percentile interval over items (module doc)."""
    a = np.asarray(nats, dtype=np.float64)
    b = np.asarray(nbytes, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("bits per byte needs one nats and one bytes figure per item, 1 or more")
    if np.any(b <= 0):
        raise ValueError("every item must have at least one byte")
    n = a.size
    value = a.sum() / b.sum() / math.log(2)
    rng = np.random.default_rng(SEED)
    block = max(1, (1 << 22) // n)  # draws per block: their index table stays small
    draws = []
    for start in range(0, DRAWS, block):
        idx = rng.integers(0, n, size=(min(block, DRAWS - start), n))
        draws.append(a[idx].sum(axis=1) / b[idx].sum(axis=1) / math.log(2))
    ratios = np.concatenate(draws)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return keys(key, value, ratios.std(ddof=1), low, high)
