"""Batches from a token version: shuffled training epochs and the fixed held-out sets
(validation for tuning and target checks, test measured once at the end).

The training stream is resumable: after every batch it exposes a ``Cursor`` (epoch,
position in that epoch's order, token offset inside the current document, segment
counter), and a stream started from a saved cursor yields exactly the batches the
uninterrupted stream would have yielded next. Resuming costs one epoch permutation
and one document read, never a replay of the batches already consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ledgerlm.config import EvalConfig, PackConfig
from ledgerlm.mixture.schedule import Segment
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


class PackedStream(Iterator[Batch]):
    """Full training batches cut from a stream of documents that a subclass picks.

    ``fetch(i)`` returns document ``i``'s token ids and domain id; ``_doc_index()``
    names the document at the cursor and ``_next_document()`` moves past it. Rows of
    ``row_len`` tokens are cut from the continuous BOS+ids+EOS stream across document
    and epoch boundaries, so no row is padded, exactly as ``pack_documents`` would cut
    them. Work is O(tokens read). ``consumed`` counts the input tokens yielded per
    domain id (every row position but the last, which is only a target).
    """

    def __init__(
        self,
        fetch: Callable[[int], tuple[np.ndarray, int]],
        row_len: int,
        batch_rows: int,
        bos: int,
        eos: int,
        reset_positions: bool,
        offset: int,
        segment: int,
        consumed: list[int] | None,
    ) -> None:
        if row_len < 2 or batch_rows < 1:
            raise ValueError("need row_len >= 2 and batch_rows >= 1")
        self._fetch = fetch
        self.row_len, self.batch_rows = row_len, batch_rows
        self.bos, self.eos, self.reset_positions = bos, eos, reset_positions
        self._offset, self._segment = offset, segment
        self.consumed: list[int] = [int(n) for n in consumed or []]
        self._doc: tuple[np.ndarray, int] | None = None
        self.identity: dict[str, Any] = {}  # what a saved state is valid for (seed, ...)
        self.domain_names: list[str] = []  # names of the domain ids, when known
        self.trained: set[int] = set()  # ids of the domains the train split holds, when known
        # (document, domain id) of each document the last batch took tokens from, in
        # order (``fetch`` indices: positions in the train split)
        self.last_documents: list[tuple[int, int]] = []
        # the documents' ids at ``fetch`` indices, when the store names them
        self.document_ids: Callable[[list[int]], list[str]] | None = None

    def describe_documents(self, placed: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The documents of ``placed`` (pairs as in ``last_documents``, any number of
        batches' worth) once each, in order, by id (by ``fetch`` index when the store has
        no ids), and the names of their domains."""
        seen = list(dict.fromkeys(placed))
        indices = [i for i, _ in seen]
        names = self.domain_names
        domains = {names[d] if d < len(names) else str(d) for _, d in seen}
        ids = self.document_ids(indices) if self.document_ids is not None else indices
        return {"documents": ids, "domains": sorted(domains)}

    def consumed_by_domain(self) -> dict[str, int]:
        """Input tokens yielded so far per domain name (every domain of the train split
        listed, a held-out-only domain not)."""
        names = self.domain_names or [str(i) for i in range(len(self.consumed))]
        counts = self.consumed + [0] * (len(names) - len(self.consumed))
        keep = self.trained or set(range(len(names)))
        return {n: c for i, (n, c) in enumerate(zip(names, counts, strict=False)) if i in keep}

    def _check_offset(self) -> None:
        if not 0 <= self._offset < len(self._current()[0]):
            raise ValueError(f"cursor offset {self._offset} outside its document")

    def _doc_index(self) -> int:
        raise NotImplementedError

    def _next_document(self, packed: int, domain: int) -> None:
        """Move past the document at the cursor (``packed`` tokens with BOS and EOS)."""
        raise NotImplementedError

    def _count(self, domains: np.ndarray) -> None:
        """Add a batch's input tokens (every row but its last position) per domain."""
        counts = np.bincount(domains[:, :-1].ravel()).tolist()
        if len(counts) > len(self.consumed):
            self.consumed.extend([0] * (len(counts) - len(self.consumed)))
        for d, n in enumerate(counts):
            self.consumed[d] += n

    def _current(self) -> tuple[np.ndarray, int]:
        """The document at the cursor, wrapped as BOS + ids + EOS (read once, then held)."""
        if self._doc is None:
            ids, domain = self._fetch(self._doc_index())
            toks = np.empty(len(ids) + 2, dtype=np.int64)
            toks[0], toks[1:-1], toks[-1] = self.bos, ids, self.eos
            self._doc = (toks, int(domain))
        return self._doc

    def _advance_document(self) -> None:
        toks, domain = self._current()
        self._doc, self._offset, self._segment = None, 0, self._segment + 1
        self._next_document(len(toks), domain)

    def __iter__(self) -> PackedStream:
        return self

    def __next__(self) -> Batch:
        need = self.row_len * self.batch_rows
        toks = np.empty(need, dtype=np.int64)
        segs = np.empty(need, dtype=np.int64)
        doms = np.empty(need, dtype=np.int64)
        filled = 0
        placed: list[tuple[int, int]] = []
        while filled < need:
            doc, domain = self._current()
            placed.append((self._doc_index(), domain))
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
        self._count(doms.reshape(shape))
        self.last_documents = placed
        return make_batch(
            toks.reshape(shape),
            segs.reshape(shape),
            valid,
            doms.reshape(shape),
            self.reset_positions,
        )


class TrainStream(PackedStream):
    """Natural sampling: epochs that each visit every document in a seeded order.

    ``order(epoch)`` gives the document indices of an epoch (``epoch_order``).
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
        consumed: list[int] | None = None,
    ) -> None:
        cursor = cursor or Cursor()
        super().__init__(
            fetch, row_len, batch_rows, bos, eos, reset_positions,
            cursor.offset, cursor.segment, consumed,
        )  # fmt: skip
        self._order_of = order
        self._epoch, self._index = cursor.epoch, cursor.index
        self._order = self._order_of(self._epoch)
        if len(self._order) == 0:
            raise ValueError("an epoch visits no documents")
        if not 0 <= self._index < len(self._order):
            raise ValueError(f"cursor index {self._index} outside epoch of {len(self._order)}")
        self._check_offset()

    @property
    def cursor(self) -> Cursor:
        """Position of the next token: after a batch, where the next batch starts."""
        return Cursor(self._epoch, self._index, self._offset, self._segment)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position to continue from (``Cursor.from_dict(state["cursor"])``)
        and the input tokens yielded so far per domain id."""
        return {"cursor": self.cursor.to_dict(), "consumed": list(self.consumed), **self.identity}

    def _doc_index(self) -> int:
        return int(self._order[self._index])

    def _next_document(self, packed: int, domain: int) -> None:
        self._index += 1
        if self._index == len(self._order):
            self._epoch, self._index = self._epoch + 1, 0
            self._order = self._order_of(self._epoch)


def domain_order(members: np.ndarray, visits: np.ndarray, seed: int, domain: int, epoch: int):
    """One domain's epoch under a mixture: its documents (``members``, indices into the
    split) each repeated by its dedup visits, in an order seeded by (seed, epoch, domain)."""
    return np.random.default_rng([seed, epoch, domain + 1]).permutation(
        np.repeat(members, visits[members])
    )


def _visits(weights: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(np.asarray(weights, dtype=np.float64)), 1).astype(np.int64)


class MixedStream(PackedStream):
    """Token-level mixture weights: documents drawn domain by domain.

    Each domain walks its own seeded epochs (``domain_order``: dedup visits included).
    The next document comes from the domain furthest below its share of the tokens
    assigned so far in the current segment: the largest ``p_i T - A_i`` (T the
    segment's tokens, A_i the domain's), ties to the larger weight, then the lower
    id. Shares are therefore kept in tokens, not documents, whatever the documents'
    lengths, and the gap to ``p_i T`` stays within about one document.

    ``segments`` are (end, weights by domain id) with ``end`` in training tokens
    (``None``: to the end); a segment starts at the first document boundary at or
    after the previous one's end, its counts starting from zero.
    """

    def __init__(
        self,
        fetch: Callable[[int], tuple[np.ndarray, int]],
        domains: np.ndarray,
        lengths: np.ndarray,
        visits: np.ndarray,
        segments: list[tuple[int | None, np.ndarray]],
        seed: int,
        row_len: int,
        batch_rows: int,
        bos: int,
        eos: int,
        reset_positions: bool = True,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        state = state or {}
        super().__init__(
            fetch, row_len, batch_rows, bos, eos, reset_positions,
            int(state.get("offset", 0)), int(state.get("segment", 0)), state.get("consumed"),
        )  # fmt: skip
        k = len(segments[0][1])
        self.seed = seed
        self._members = [np.flatnonzero(domains == d) for d in range(k)]
        self._visits = visits
        # a training token is one of row_len - 1 inputs per row_len stream tokens
        self._ends = [
            None if end is None else -(-end * row_len // (row_len - 1)) for end, _ in segments
        ]
        self._weights = [np.asarray(w, dtype=np.float64) for _, w in segments]
        for w in self._weights:
            for d in np.flatnonzero(w > 0):
                if len(self._members[d]) == 0:
                    raise ValueError(f"domain id {d} has weight {w[d]:g} but no train documents")
        mix = state.get("mix")
        self._override: np.ndarray | None = None  # weights set by reweight(), if any
        if mix is not None and mix.get("override") is not None:
            self._override = np.asarray(mix["override"], dtype=np.float64)
        if mix is None:
            self._epochs = [0] * k
            self._index = [0] * k
            self._assigned = np.zeros(k, dtype=np.int64)
            self._total, self._stage = 0, self._stage_at(0)
            self._domain = self._choose()
        else:
            self._epochs = [int(e) for e, _ in mix["orders"]]
            self._index = [int(i) for _, i in mix["orders"]]
            self._assigned = np.asarray(mix["assigned"], dtype=np.int64)
            self._total, self._stage = int(mix["total"]), int(mix["stage"])
            self._domain = int(mix["domain"])
        self._orders = [self._order(d) for d in range(k)]
        if not 0 <= self._index[self._domain] < len(self._orders[self._domain]):
            raise ValueError("mixture cursor outside its domain's epoch")
        self._check_offset()

    def _order(self, d: int) -> np.ndarray:
        if len(self._members[d]) == 0:
            return self._members[d]
        return domain_order(self._members[d], self._visits, self.seed, d, self._epochs[d])

    def _stage_at(self, position: int) -> int:
        for i, end in enumerate(self._ends):
            if end is None or position < end:
                return i
        return len(self._ends) - 1

    def reweight(self, weights: Sequence[float]) -> None:
        """From the next document on, sample by ``weights`` (by domain id) instead of
        the segments, counting shares afresh (an online reweighting such as DoReMi's).
        The document in progress finishes first; the state keeps the new weights."""
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != self._weights[0].shape or not np.all(w >= 0) or w.sum() <= 0:
            raise ValueError(f"reweight: expected {len(self._weights[0])} weights >= 0")
        for d in np.flatnonzero(w > 0):
            if len(self._members[d]) == 0:
                raise ValueError(f"domain id {d} has weight {w[d]:g} but no train documents")
        self._override = w / w.sum()
        self._assigned = np.zeros_like(self._assigned)

    def _choose(self) -> int:
        w = self._weights[self._stage] if self._override is None else self._override
        deficit = w * float(self._assigned.sum()) - self._assigned
        deficit[w <= 0] = -np.inf
        # lexsort: the last key is the primary one
        return int(np.lexsort((np.arange(len(w)), -w, -deficit))[0])

    def _doc_index(self) -> int:
        return int(self._orders[self._domain][self._index[self._domain]])

    def _next_document(self, packed: int, domain: int) -> None:
        d = self._domain
        self._assigned[d] += packed
        self._total += packed
        self._index[d] += 1
        if self._index[d] == len(self._orders[d]):
            self._epochs[d], self._index[d] = self._epochs[d] + 1, 0
            self._orders[d] = self._order(d)
        stage = self._stage_at(self._total)
        if stage != self._stage and self._override is None:
            self._stage, self._assigned = stage, np.zeros_like(self._assigned)
        self._domain = self._choose()

    def state_dict(self) -> dict[str, Any]:
        return {
            "mix": {
                "domain": self._domain,
                "orders": [[e, i] for e, i in zip(self._epochs, self._index, strict=True)],
                "assigned": self._assigned.tolist(),
                "total": self._total,
                "stage": self._stage,
                "override": None if self._override is None else self._override.tolist(),
            },
            "offset": self._offset,
            "segment": self._segment,
            "consumed": list(self.consumed),
            **self.identity,
        }


def natural_shares(store: TokenStore) -> dict[str, float]:
    """Each domain's share of the tokens of one natural epoch of the train split: its
    documents' packed lengths (BOS + ids + EOS) times their dedup visits."""
    docs = store.split_docs("train")
    packed = (docs["length"] + 2) * _visits(docs["weight"])
    per = np.bincount(docs["domain"], weights=packed, minlength=len(store.domains))
    total = float(per.sum())
    return {d: float(per[i]) / total for i, d in _trained(store, docs)}


def train_pools(store: TokenStore) -> dict[str, int]:
    """Each domain's unique tokens in the train split (S_i of a mixture plan)."""
    docs = store.split_docs("train")
    per = np.bincount(docs["domain"], weights=docs["length"], minlength=len(store.domains))
    return {d: int(per[i]) for i, d in _trained(store, docs)}


def _trained(store: TokenStore, docs: dict[str, np.ndarray]) -> list[tuple[int, str]]:
    """(id, name) of the domains the train split holds documents of (a domain only a
    held-out split has is not one training can sample)."""
    present = set(np.unique(docs["domain"]).tolist())
    return [(i, d) for i, d in enumerate(store.domains) if i in present]


def _check_saved_for(identity: dict[str, Any], saved: Mapping[str, Any]) -> None:
    """A saved stream state is refused unless it was saved for this stream (``identity``:
    seed, train documents, mixture)."""
    for key, value in identity.items():
        if saved.get(key) != value:
            raise ValueError(
                f"data cursor was saved for another stream: its {key} differs "
                f"(saved {_short(saved.get(key))}, this stream {_short(value)})"
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def train_batches(
    store: TokenStore,
    pack: PackConfig,
    batch_rows: int,
    seed: int,
    cursor: Cursor | Mapping[str, Any] | None = None,
    mixture: Sequence[Segment] | None = None,
) -> PackedStream:
    """An endless stream of training batches from the train split.

    Natural sampling (``mixture`` None, or one natural segment): each epoch visits
    every train document in a seeded order. Otherwise a ``MixedStream`` over the
    mixture's segments. The packed stream runs on across epoch boundaries, so no row
    is padded. ``cursor`` is a ``Cursor`` (natural only) or a ``state_dict()`` of an
    earlier stream, which is refused unless it was saved for the same seed, train
    documents and mixture; the new stream then continues exactly where that one stood.
    """
    docs = store.split_docs("train")
    if len(docs["length"]) == 0:
        raise ValueError("train split is empty")
    mixed = mixture is not None and not (len(mixture) == 1 and mixture[0].natural)
    identity: dict[str, Any] = {"seed": seed, "documents": len(docs["length"])}
    if mixed:
        identity["mixture"] = [seg.to_dict() for seg in mixture]
    state: Mapping[str, Any] | None = None
    if isinstance(cursor, Mapping):
        _check_saved_for(identity, cursor)
        state = cursor

    def fetch(i: int) -> tuple[np.ndarray, int]:
        ids = store.tokens(docs["shard"][i], int(docs["offset"][i]), int(docs["length"][i]))
        return ids, int(docs["domain"][i])

    sp = store.special
    shape = (pack.seq_len + 1, batch_rows, sp["bos"], sp["eos"], pack.reset_positions)
    stream: PackedStream
    if mixed:
        segments = [(seg.end, [seg.weights.get(d, 0.0) for d in store.domains]) for seg in mixture]
        if isinstance(cursor, Cursor):
            raise ValueError("a mixed stream resumes from a state_dict(), not a Cursor")
        stream = MixedStream(
            fetch, docs["domain"], docs["length"], _visits(docs["weight"]), segments, seed,
            *shape, state=state,
        )  # fmt: skip
    else:
        at = Cursor.from_dict(state["cursor"]) if state is not None else cursor
        consumed = state.get("consumed") if state is not None else None
        stream = TrainStream(
            fetch,
            lambda epoch: epoch_order(docs["weight"], seed, epoch),
            *shape,
            cursor=at,
            consumed=consumed,
        )
    # names only a mixture needs: a store without them reports domains by id
    stream.identity, stream.domain_names = identity, list(getattr(store, "domains", []))
    stream.trained = {int(d) for d in np.unique(docs["domain"])}
    if hasattr(store, "doc_ids"):
        stream.document_ids = lambda indices: store.doc_ids("train", indices)
    return stream


def _held_out_batches(
    store: TokenStore, pack: PackConfig, max_tokens: int, batch_rows: int, split: str
) -> list[Batch]:
    """One split packed in index order (no shuffling), ``max_tokens`` shared by domain
    (0: every document whole); [] when the split has no documents."""
    docs = store.split_docs(split)
    if len(docs["length"]) == 0:
        return []
    domains = np.unique(docs["domain"])
    whole = int(docs["length"].sum()) + 2 * len(docs["length"])  # every token, BOS/EOS
    per_domain = max_tokens // max(len(domains), 1) if max_tokens else whole

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
    out = _held_out_batches(store, pack, cfg.max_tokens, batch_rows, "val")
    if not out:
        raise ValueError("validation split has no supervised targets")
    return out


def test_batches(
    store: TokenStore, pack: PackConfig, cfg: EvalConfig, batch_rows: int
) -> list[Batch]:
    """The test split, packed like ``validation_batches`` (index order): the whole split
    by default (``eval.test_max_tokens = 0``), else that many tokens shared by domain as
    ``eval.max_tokens`` is for validation; [] when the split is empty
    (``data.test_fraction = 0``). Scored after training only (``EvalCallback.score_test``).
    The batches are host tensors, about 40 bytes per token; the device holds a chunk of
    them at a time while they are scored.
    """
    return _held_out_batches(store, pack, cfg.test_max_tokens, batch_rows, "test")


# Its name starts with "test": keep pytest from collecting it where a test module imports it.
test_batches.__test__ = False  # type: ignore[attr-defined]
