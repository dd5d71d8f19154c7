"""Shared by tests of the train stream: a token store over in-memory documents, so a
stream (and a trainer over it) runs without building a token version."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPECIAL = {"bos": 1, "eos": 2, "pad": 0}


class FakeTokenStore:
    """The TokenStore members the train stream reads (``special``, ``domains``,
    ``split_docs``, ``tokens``): every document in one shard, of the domain id given for
    it, with the given dedup weight (1 by default); ``names`` are the domains' names (none:
    the stream reports domains by id)."""

    def __init__(
        self,
        docs: Sequence[Sequence[int]],
        domains: Sequence[int],
        names: Sequence[str] = (),
        weights: Sequence[float] | None = None,
    ) -> None:
        self.special = dict(SPECIAL)
        self.domains = list(names)
        self.flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
        lengths = np.array([len(d) for d in docs])
        self.docs = {
            "shard": np.array(["train.bin"] * len(docs), dtype=object),
            "offset": np.concatenate([[0], np.cumsum(lengths)[:-1]]),
            "length": lengths,
            "domain": np.asarray(domains, dtype=np.int64),
            "weight": np.ones(len(docs)) if weights is None else np.asarray(weights, float),
        }

    def split_docs(self, split):
        return self.docs

    def tokens(self, shard, offset, length):
        return self.flat[offset : offset + length]


def two_domain_store(n: int = 30, vocab: int = 60) -> FakeTokenStore:
    """``n`` seeded documents of 1 to 39 tokens below ``vocab``, alternating between
    domains a and b, each of dedup weight 1 or 2."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, vocab, size=rng.integers(1, 40)) for _ in range(n)]
    weights = rng.integers(1, 3, size=n).astype(float)
    return FakeTokenStore(docs, np.arange(n) % 2, ["a", "b"], weights)
