"""Exact deduplication on normalized text, and the keeper rules shared with near dedup.

The driver holds a 16-byte digest (``shingles.word_digests``) and a rank per document
(never the text); grouping is a sort, so memory is O(documents) and the result does not
depend on the order in which shards finished.
"""

from __future__ import annotations

import numpy as np

KEEPERS = ("first", "longest", "newest")


def keeper_rank(rule: str, chars: np.ndarray, dates: np.ndarray) -> np.ndarray:
    """Rank of every document under a keeper rule (0 = kept first); ties by input order.

    first: earliest in input order; longest: most characters; newest: latest date
    (ISO strings compare in time order; a missing date counts as oldest).
    """
    n = len(chars)
    order_idx = np.arange(n)
    if rule == "first":
        order = order_idx
    elif rule == "longest":
        order = np.lexsort((order_idx, -np.asarray(chars, dtype=np.int64)))
    elif rule == "newest":
        keys = np.array(["" if d is None else str(d) for d in dates], dtype=object)
        _, codes = np.unique(keys, return_inverse=True)  # codes ascend with the date string
        order = np.lexsort((order_idx, -codes.reshape(-1)))
    else:
        raise ValueError(f"unknown keeper rule {rule!r} (one of {', '.join(KEEPERS)})")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank


def group_keepers(labels: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """For each document, the index of the best-ranked document with the same label."""
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((rank, labels))  # by label, best rank first
    first = np.ones(n, dtype=bool)
    first[1:] = labels[order][1:] != labels[order][:-1]
    best_of_group = order[first]
    group_of_sorted = np.cumsum(first) - 1
    keeper = np.empty(n, dtype=np.int64)
    keeper[order] = best_of_group[group_of_sorted]
    return keeper


def exact_keepers(digests: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(N, 2) uint64 digests -> for each document, the keeper of its exact-duplicate group."""
    if len(digests) == 0:
        return np.zeros(0, dtype=np.int64)
    # the labels of np.unique(digests, axis=0), from a sort of two uint64 keys (unique
    # along an axis sorts the rows as opaque records, several times slower)
    order = np.lexsort((digests[:, 1], digests[:, 0]))
    ordered = digests[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    labels = np.empty(len(order), dtype=np.int64)
    labels[order] = np.cumsum(new) - 1
    return group_keepers(labels, rank)
