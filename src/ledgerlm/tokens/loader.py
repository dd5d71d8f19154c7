"""Batches from a token version: shuffled training epochs and the fixed held-out sets
(validation for tuning and target checks, test measured once at the end).

The training stream is resumable: after every batch it exposes a ``Cursor`` (epoch,
position in that epoch's order, token offset inside the current document, segment
counter), and a stream started from a saved cursor yields exactly the batches the
uninterrupted stream would have yielded next. Resuming costs one epoch permutation
and one document read, never a replay of the batches already consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ledgerlm.config import EvalConfig, PackConfig
from ledgerlm.tokens.packing import Batch, batches, make_batch, pack_documents
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


@dataclass(frozen=True)
class Cursor:
    """Where the next row of a training stream starts.

    ``offset`` counts tokens of the document as packed (BOS + ids + EOS), so a row
    that starts mid-document is rebuilt from the same tokens. ``segment`` is that
    document's segment id: ids keep counting across epochs, so a resumed stream
    gives every token the same segment id as the uninterrupted one.
    """

    epoch: int = 0
    index: int = 0  # position in this epoch's order
    offset: int = 0  # token offset inside BOS + ids + EOS of the document at ``index``
    segment: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cursor:
        return cls(**{k: int(d[k]) for k in ("epoch", "index", "offset", "segment")})


class TrainStream(Iterator[Batch]):
    """An endless stream of full training batches cut from the epochs' documents.

    ``fetch(i)`` returns document ``i``'s token ids and domain; ``order(epoch)`` the
    document indices of an epoch. Rows of ``row_len`` tokens are cut from the
    continuous BOS+ids+EOS stream across document and epoch boundaries, so no row is
    padded, exactly as ``pack_documents`` would cut them. Work is O(tokens read).
    """

    def __init__(
        self,
        fetch: Callable[[int], tuple[np.ndarray, int]],
        order: Callable[[int], np.ndarray],
        row_len: int,
        batch_rows: int,
        bos: int,
        eos: int,
        reset_positions: bool = True,
        cursor: Cursor | None = None,
    ) -> None:
        if row_len < 2 or batch_rows < 1:
            raise ValueError("need row_len >= 2 and batch_rows >= 1")
        self._fetch, self._order_of = fetch, order
        self.row_len, self.batch_rows = row_len, batch_rows
        self.bos, self.eos, self.reset_positions = bos, eos, reset_positions
        cursor = cursor or Cursor()
        self._epoch, self._index = cursor.epoch, cursor.index
        self._offset, self._segment = cursor.offset, cursor.segment
        self._order = self._order_of(self._epoch)
        if len(self._order) == 0:
            raise ValueError("an epoch visits no documents")
        if not 0 <= self._index < len(self._order):
            raise ValueError(f"cursor index {self._index} outside epoch of {len(self._order)}")
        self._doc: tuple[np.ndarray, int] | None = None
        if not 0 <= self._offset < len(self._current()[0]):
            raise ValueError(f"cursor offset {self._offset} outside its document")

    @property
    def cursor(self) -> Cursor:
        """Position of the next token: after a batch, where the next batch starts."""
        return Cursor(self._epoch, self._index, self._offset, self._segment)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position to continue from (``Cursor.from_dict(state["cursor"])``)."""
        return {"cursor": self.cursor.to_dict()}

    def _current(self) -> tuple[np.ndarray, int]:
        """The document at the cursor, wrapped as BOS + ids + EOS (read once, then held)."""
        if self._doc is None:
            ids, domain = self._fetch(int(self._order[self._index]))
            toks = np.empty(len(ids) + 2, dtype=np.int64)
            toks[0], toks[1:-1], toks[-1] = self.bos, ids, self.eos
            self._doc = (toks, int(domain))
        return self._doc

    def _advance_document(self) -> None:
        self._doc, self._offset, self._segment = None, 0, self._segment + 1
        self._index += 1
        if self._index == len(self._order):
            self._epoch, self._index = self._epoch + 1, 0
            self._order = self._order_of(self._epoch)

    def __iter__(self) -> TrainStream:
        return self

    def __next__(self) -> Batch:
        need = self.row_len * self.batch_rows
        toks = np.empty(need, dtype=np.int64)
        segs = np.empty(need, dtype=np.int64)
        doms = np.empty(need, dtype=np.int64)
        filled = 0
        while filled < need:
            doc, domain = self._current()
            take = min(len(doc) - self._offset, need - filled)
            toks[filled : filled + take] = doc[self._offset : self._offset + take]
            segs[filled : filled + take] = self._segment
            doms[filled : filled + take] = domain
            filled += take
            self._offset += take
            if self._offset == len(doc):
                self._advance_document()
        shape = (self.batch_rows, self.row_len)
        valid = np.ones(shape, dtype=bool)
        return make_batch(
            toks.reshape(shape),
            segs.reshape(shape),
            valid,
            doms.reshape(shape),
            self.reset_positions,
        )


class StoreStream(TrainStream):
    """A ``TrainStream`` over a token store's train split, with a checkable state.

    ``cursor`` may be a ``state_dict()`` of an earlier stream: it is refused unless it
    was saved for the same seed and number of train documents.
    """

    def __init__(
        self,
        store: TokenStore,
        pack: PackConfig,
        batch_rows: int,
        seed: int,
        cursor: Cursor | Mapping[str, Any] | None = None,
    ) -> None:
        docs = store.split_docs("train")
        if len(docs["length"]) == 0:
            raise ValueError("train split is empty")
        self.seed, self.documents = seed, len(docs["length"])
        if isinstance(cursor, Mapping):
            found = {"seed": self.seed, "documents": self.documents}
            saved = {k: cursor.get(k) for k in found}
            if saved != found:
                raise ValueError(f"data cursor was saved for {saved}, this stream has {found}")
            cursor = Cursor.from_dict(cursor["cursor"])

        def fetch(i: int) -> tuple[np.ndarray, int]:
            ids = store.tokens(docs["shard"][i], int(docs["offset"][i]), int(docs["length"][i]))
            return ids, int(docs["domain"][i])

        sp = store.special
        super().__init__(
            fetch,
            lambda epoch: epoch_order(docs["weight"], seed, epoch),
            pack.seq_len + 1,
            batch_rows,
            sp["bos"],
            sp["eos"],
            pack.reset_positions,
            cursor,
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: the cursor plus what it is only valid for (seed, document count)."""
        return {**super().state_dict(), "seed": self.seed, "documents": self.documents}


def train_batches(
    store: TokenStore,
    pack: PackConfig,
    batch_rows: int,
    seed: int,
    cursor: Cursor | Mapping[str, Any] | None = None,
) -> StoreStream:
    """An endless stream: each epoch visits every train document in a seeded order.

    The packed stream runs on across epoch boundaries, so no row is padded.
    ``cursor`` is a ``Cursor`` or a ``state_dict()`` of an earlier stream; the new
    stream then continues exactly where that one stood.
    """
    return StoreStream(store, pack, batch_rows, seed, cursor)


def _held_out_batches(
    store: TokenStore, pack: PackConfig, cfg: EvalConfig, batch_rows: int, split: str
) -> list[Batch]:
    """One split packed in index order (no shuffling), ``max_tokens`` shared by domain;
    [] when the split has no documents."""
    docs = store.split_docs(split)
    if len(docs["length"]) == 0:
        return []
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
        raise ValueError(f"{split} split has no supervised targets")
    return out


def validation_batches(
    store: TokenStore, pack: PackConfig, cfg: EvalConfig, batch_rows: int
) -> list[Batch]:
    """The val split packed in index order (no shuffling), ``max_tokens`` shared by domain.

    Every run on the same token version and sequence length scores exactly the
    same targets; the last row is padded and its padding marked invalid. An empty
    val split is an error.
    """
    out = _held_out_batches(store, pack, cfg, batch_rows, "val")
    if not out:
        raise ValueError("validation split has no supervised targets")
    return out


def test_batches(
    store: TokenStore, pack: PackConfig, cfg: EvalConfig, batch_rows: int
) -> list[Batch]:
    """The test split, packed exactly like ``validation_batches`` (index order, the same
    per-domain share of ``eval.max_tokens``); [] when the split is empty
    (``data.test_fraction = 0``). Meant to be scored once, after training.
    """
    return _held_out_batches(store, pack, cfg, batch_rows, "test")


# Its name starts with "test": keep pytest from collecting it where a test module imports it.
test_batches.__test__ = False  # type: ignore[attr-defined]
