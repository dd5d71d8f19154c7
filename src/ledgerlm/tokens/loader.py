"""Batches from a token version: shuffled training epochs and the fixed validation set."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ledgerlm.config import EvalConfig, PackConfig
from ledgerlm.tokens.packing import Batch, batches, pack_documents
from ledgerlm.tokens.shards import TokenStore


def epoch_order(weights: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Document indices of one epoch in a seeded order.

    A kept document's dedup weight (1, or its cluster size under ``weights =
    "preserve"``) is how many times the epoch visits it, so "preserve" restores the
    distribution the corpus had before deduplication.
    """
    visits = np.maximum(np.rint(np.asarray(weights, dtype=np.float64)), 1).astype(np.int64)
    return np.random.default_rng([seed, epoch]).permutation(
        np.repeat(np.arange(len(visits)), visits)
    )


def train_batches(
    store: TokenStore, pack: PackConfig, batch_rows: int, seed: int
) -> Iterator[Batch]:
    """An endless stream: each epoch visits every train document in a seeded order.

    The packed stream runs on across epoch boundaries, so no row is padded.
    """
    docs = store.split_docs("train")
    if len(docs["length"]) == 0:
        raise ValueError("train split is empty")

    # A kept document's dedup weight (1, or its cluster size under "preserve") is how
    # many times an epoch visits it, so "preserve" restores the pre-dedup distribution.
    visits = np.repeat(
        np.arange(len(docs["length"])), np.maximum(np.rint(docs["weight"]), 1).astype(int)
    )

    def documents():
        epoch = 0
        while True:
            for i in np.random.default_rng([seed, epoch]).permutation(visits):
                tokens = store.tokens(
                    docs["shard"][i], int(docs["offset"][i]), int(docs["length"][i])
                )
                yield tokens, int(docs["domain"][i])
            epoch += 1

    sp = store.special
    rows = pack_documents(documents(), pack.seq_len + 1, sp["bos"], sp["eos"], sp["pad"])
    return batches(rows, batch_rows, pack.reset_positions)


def validation_batches(
    store: TokenStore, pack: PackConfig, cfg: EvalConfig, batch_rows: int
) -> list[Batch]:
    """The val split packed in index order (no shuffling), ``max_tokens`` shared by domain.

    Every run on the same token version and sequence length scores exactly the
    same targets; the last row is padded and its padding marked invalid.
    """
    docs = store.split_docs("val")
    domains = np.unique(docs["domain"])
    per_domain = cfg.max_tokens // max(len(domains), 1)

    def capped():
        # Every domain gets an equal share of the budget, so each per-domain loss is
        # measured on a real sample rather than whatever sorts first.
        for dom in domains:
            used = 0
            for i in np.flatnonzero(docs["domain"] == dom):
                if used >= per_domain:
                    break
                take = min(int(docs["length"][i]), per_domain - used)
                used += take + 2
                yield store.tokens(docs["shard"][i], int(docs["offset"][i]), take), int(dom)

    sp = store.special
    rows = pack_documents(capped(), pack.seq_len + 1, sp["bos"], sp["eos"], sp["pad"])
    out = list(batches(rows, batch_rows, pack.reset_positions))
    if not out or sum(b.num_targets for b in out) == 0:
        raise ValueError("validation split has no supervised targets")
    return out
