"""Out-of-core clustering of near-duplicate candidates (requirement D4).

Documents arrive shard by shard; only their LSH band keys are kept, on disk, hash
partitioned. Clustering then reads one partition at a time, turns documents that share a
band key into candidate edges, optionally checks each edge with the exact Jaccard of the
stored shingle sets, and merges clusters with a vectorized union-find.

Memory, for ``N`` documents with ``b`` bands and ``P`` partitions (the goal is well under
2 KB per document beyond the batch in flight):

* ``EdgeIndex.add`` holds only the batch (16 B per document and band while it is written);
  the index itself is on disk, 16 B per document and band.
* ``cluster`` holds the union-find parents (8 B per document), the labels it returns
  (8 B per document), and one partition while it is turned into edges: about
  40 B x N x b / P (records, sort order, gathered columns), i.e. 35 B per document with
  FineWeb's 14 bands and 16 partitions. Raise ``partitions`` with the corpus to keep that
  term flat. The edges of a partition are usually far fewer than its records.
* ``ShingleStore`` writes the shingle sets to disk (8 B per shingle, 16 B per document
  of slots). ``jaccard`` reads only the ranges of the pairs in flight (at most
  ``_JACCARD_ELEMS`` hashes, ~30 MB of scratch); the slot table is memory-mapped, so up
  to 16 B per document of it can become resident.

Everything is deterministic: edges are sorted before use, and every cluster is labelled by
its smallest document id, whatever the order in which documents or edges arrived.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.data.minhash import LSHParams

_PAIR = np.dtype([("key", "<u8"), ("doc", "<i8")])

# Candidate edges checked per call of ``verify``.
VERIFY_BATCH = 1 << 16
# Shingles gathered at once by ``ShingleStore.jaccard`` (about 60 B of scratch each).
_JACCARD_ELEMS = 1 << 19
# Hashes between two stored ranges that are read rather than seeked over (4 KB).
_READ_GAP = 512


def _unique_pairs(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Distinct (left, right) rows, sorted; one packed int64 sort when ids fit 31 bits."""
    if len(left) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if int(max(left.max(), right.max())) < 1 << 31:
        packed = np.unique((left << 32) | right)
        return np.stack([packed >> 32, packed & 0xFFFFFFFF], axis=1)
    order = np.lexsort((right, left))
    left, right = left[order], right[order]
    keep = np.ones(len(left), dtype=bool)
    keep[1:] = (left[1:] != left[:-1]) | (right[1:] != right[:-1])
    return np.stack([left[keep], right[keep]], axis=1)


class EdgeIndex:
    """(band key, document) pairs on disk, split into ``partitions`` files by key hash.

    Equal keys always land in the same partition, so a partition holds every document of
    each of its keys and can be clustered alone. A new index starts empty (it truncates
    the partition files in ``workdir``).
    """

    def __init__(self, workdir: Path | str, params: LSHParams, partitions: int = 16) -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1: {partitions}")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.params = params
        self.partitions = partitions
        self.documents = 0
        for p in range(partitions):
            self.path(p).write_bytes(b"")

    def path(self, partition: int) -> Path:
        return self.workdir / f"edges-{partition:04d}.bin"

    def add(self, doc_ids: np.ndarray, keys: np.ndarray) -> None:
        """Append a batch: ``keys`` is (len(doc_ids), bands) uint64 from ``band_keys``."""
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        keys = np.asarray(keys, dtype=np.uint64)
        if keys.shape != (len(doc_ids), self.params.bands):
            raise ValueError(
                f"keys must be ({len(doc_ids)}, {self.params.bands}); got {keys.shape}"
            )
        if len(doc_ids) == 0:
            return
        if int(doc_ids.min()) < 0:
            raise ValueError("document ids must be >= 0")
        flat = keys.ravel()
        part = (flat % np.uint64(self.partitions)).astype(np.intp)
        # a stable sort of small integers is a radix sort (5x faster) when they are narrow
        narrow = part.astype(np.uint16) if self.partitions <= 1 << 16 else part
        order = np.argsort(narrow, kind="stable")
        records = np.empty(len(flat), dtype=_PAIR)
        records["key"] = flat[order]
        records["doc"] = np.repeat(doc_ids, self.params.bands)[order]
        bounds = np.zeros(self.partitions + 1, dtype=np.int64)
        np.cumsum(np.bincount(part, minlength=self.partitions), out=bounds[1:])
        for p in range(self.partitions):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if hi > lo:
                with self.path(p).open("ab") as f:
                    records[lo:hi].tofile(f)
        self.documents += len(doc_ids)

    def disk_bytes(self) -> int:
        return sum(self.path(p).stat().st_size for p in range(self.partitions))

    def candidate_edges(self) -> Iterator[np.ndarray]:
        """Per partition, the distinct star edges (smallest document of a key group, other).

        Star edges connect a group of ``m`` documents with ``m - 1`` edges instead of
        ``m(m-1)/2``. Yields sorted int64 arrays of shape (edges, 2), left < right.
        """
        for p in range(self.partitions):
            records = np.fromfile(self.path(p), dtype=_PAIR)
            if len(records) < 2:
                continue
            keys = records["key"]
            order = np.argsort(keys)
            keys = keys[order]
            same = keys[1:] == keys[:-1]
            shared = np.zeros(len(keys), dtype=bool)
            shared[1:] = same
            shared[:-1] |= same
            if not shared.any():
                continue
            # Only keys held by two or more documents matter; the rest leave here.
            keys = keys[shared]
            docs = records["doc"][order[shared]]
            del records, order, shared, same
            first = np.ones(len(keys), dtype=bool)
            first[1:] = keys[1:] != keys[:-1]
            starts = np.flatnonzero(first)
            roots = np.minimum.reduceat(docs, starts)
            root_of = np.repeat(roots, np.diff(np.append(starts, len(keys))))
            other = docs != root_of
            edges = _unique_pairs(root_of[other], docs[other])
            if len(edges):
                yield edges


class UnionFind:
    """Disjoint sets over documents 0..n-1 as one int64 parent array (8 B per document).

    Merging is vectorized: each round hooks every edge's larger root under its smaller
    one (``np.minimum.at`` keeps the smallest proposal), then pointer jumping compresses
    the hooked roots. A parent is never larger than its child, so no cycle can form and
    every root is the smallest id of its cluster, whatever the order of the edges.
    Between calls the forest is flat: every parent is a root.
    """

    def __init__(self, n: int) -> None:
        self.parent = np.arange(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.parent)

    def find(self, nodes: np.ndarray) -> np.ndarray:
        return self.parent[np.asarray(nodes, dtype=np.int64)]

    def union_edges(self, edges: np.ndarray) -> None:
        edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        if len(edges) == 0:
            return
        parent = self.parent
        ru = parent[edges[:, 0]]
        rv = parent[edges[:, 1]]
        hooked: list[np.ndarray] = []
        while True:
            differ = ru != rv
            if not differ.any():
                break
            ru, rv = ru[differ], rv[differ]
            lo = np.minimum(ru, rv)
            hi = np.maximum(ru, rv)
            np.minimum.at(parent, hi, lo)
            hooked.append(hi)
            moved = np.concatenate(hooked) if len(hooked) > 1 else hi
            # Pointer jumping over every root hooked in this call, until each points at a
            # current root; chains of hooks within one round halve at every step.
            while True:
                up = parent[moved]
                upup = parent[up]
                if np.array_equal(up, upup):
                    break
                parent[moved] = upup
            ru = parent[ru]
            rv = parent[rv]
        if hooked:
            # A document points at its root from before this call, and that root at a
            # current root (it was compressed above): one jump flattens everything.
            parent[:] = parent[parent]

    def roots(self) -> np.ndarray:
        """The root of every document: the smallest document id of its cluster."""
        return self.parent.copy()


@dataclass(frozen=True)
class ClusterResult:
    labels: np.ndarray  # int64, the smallest document id of each document's cluster
    candidate_edges: int
    verified_edges: int
    rejected_edges: int
    skipped_edges: int  # not checked: both ends were already in one cluster

    @property
    def duplicates(self) -> int:
        """Documents that are not the representative of their cluster."""
        return int(np.count_nonzero(self.labels != np.arange(len(self.labels))))

    def to_dict(self) -> dict[str, Any]:
        return {
            "documents": len(self.labels),
            "duplicates": self.duplicates,
            "candidate_edges": self.candidate_edges,
            "verified_edges": self.verified_edges,
            "rejected_edges": self.rejected_edges,
            "skipped_edges": self.skipped_edges,
        }


Verifier = Callable[[np.ndarray, np.ndarray], np.ndarray]


def cluster(
    index: EdgeIndex,
    n_docs: int,
    verify: Verifier | None = None,
    threshold: float | None = None,
) -> ClusterResult:
    """Connected components of the candidate edges, optionally only of verified ones.

    ``verify(left, right)`` returns the exact similarity of each candidate pair; an edge
    is kept when it is at least ``threshold`` (default: the index's LSH threshold). An
    edge whose two documents are already in one cluster is not checked, since keeping or
    rejecting it cannot change the clusters; this skips most of the repeats that arise
    when a pair shares several bands. Without ``verify`` every candidate edge is kept
    (verified and rejected counts stay 0).

    Known limit of star edges with verification: if the smallest document of a key group
    is not similar to the others, those others are not joined through that key; they
    usually share other bands with each other.
    """
    if threshold is None:
        threshold = index.params.threshold
    uf = UnionFind(n_docs)
    candidates = verified = rejected = skipped = 0
    for edges in index.candidate_edges():
        if int(edges.max()) >= n_docs:
            raise ValueError(f"edge to document {int(edges.max())} but n_docs={n_docs}")
        candidates += len(edges)
        if verify is None:
            uf.union_edges(edges)
            continue
        same = uf.find(edges[:, 0]) == uf.find(edges[:, 1])
        skipped += int(same.sum())
        todo = edges[~same]
        kept: list[np.ndarray] = []
        for lo in range(0, len(todo), VERIFY_BATCH):
            batch = todo[lo : lo + VERIFY_BATCH]
            sims = np.asarray(verify(batch[:, 0], batch[:, 1]), dtype=np.float64)
            ok = sims >= threshold
            verified += int(ok.sum())
            rejected += int(len(ok) - ok.sum())
            kept.append(batch[ok])
        if kept:
            uf.union_edges(np.concatenate(kept))
    return ClusterResult(uf.roots(), candidates, verified, rejected, skipped)


def _copy(src, dst, size: int) -> None:
    """``size`` bytes from file ``src`` to the end of file ``dst``, in the kernel where
    it can (``os.copy_file_range``), else through a buffer."""
    dst.flush()
    left = size
    at = dst.tell()
    if hasattr(os, "copy_file_range"):
        try:
            while left > 0:
                done = os.copy_file_range(
                    src.fileno(), dst.fileno(), left, size - left, at + size - left
                )
                if done == 0:
                    break
                left -= done
        except OSError:
            pass
    if left > 0:
        src.seek(size - left)
        dst.seek(at + size - left)
        while left > 0 and (chunk := src.read(min(left, 1 << 20))):
            dst.write(chunk)
            left -= len(chunk)
    if left:
        raise OSError(f"{src.name}: short read while copying")


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + n)`` for every (s, n), without a Python loop."""
    total = int(lengths.sum())
    firsts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    out = np.arange(total, dtype=np.int64)
    out += np.repeat(starts - firsts, lengths)
    return out


class ShingleStore:
    """Shingle sets of every document on disk, for exact Jaccard of candidate pairs.

    Two files: the hashes of all documents back to back, appended batch by batch as they
    come (8 B per shingle; repeats and order do not matter, so no document is sorted just
    in case it becomes a candidate), and a (start, end) slot per document id (16 B per
    document). Documents may arrive in any order; an id never added is an empty set.
    Reading fetches only the ranges of the documents being compared, chunk by chunk, so
    memory follows the pairs in flight, not the store.
    """

    def __init__(self, workdir: Path | str) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._hashes = self.workdir / "shingles.u64"
        self._slots = self.workdir / "slots.i64"
        self._hashes.write_bytes(b"")
        self._slots.write_bytes(b"")
        self.documents = 0  # slots on disk: ids below this may have a set
        self.shingles = 0
        self._maps: np.ndarray | None = None

    def add(self, doc_ids: np.ndarray, shingle_sets: Sequence[np.ndarray]) -> None:
        """Store the sets of ``doc_ids``; they need not be sorted or distinct."""
        counts = np.fromiter((len(s) for s in shingle_sets), dtype=np.int64)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = (
            np.concatenate([np.asarray(s, dtype=np.uint64) for s in shingle_sets])
            if len(shingle_sets)
            else np.zeros(0, dtype=np.uint64)
        )
        self.add_flat(doc_ids, flat, offsets)

    def add_flat(self, doc_ids: np.ndarray, hashes: np.ndarray, offsets: np.ndarray) -> None:
        """``add`` for sets laid out as in ``ShingleBatch`` (no Python object per set)."""
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        hashes = np.asarray(hashes, dtype=np.uint64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) != len(doc_ids) + 1:
            raise ValueError("offsets must have one entry more than doc_ids")
        if len(doc_ids) == 0:
            return
        if int(doc_ids.min()) < 0 or len(np.unique(doc_ids)) != len(doc_ids):
            raise ValueError("document ids must be distinct and >= 0")
        base = self.shingles
        with self._hashes.open("ab") as f:
            hashes.astype("<u8", copy=False).tofile(f)
        self.shingles += len(hashes)
        self._set_slots(doc_ids, base + offsets[:-1], base + offsets[1:])

    def add_file(self, doc_ids: np.ndarray, path: Path | str, offsets: np.ndarray) -> None:
        """``add_flat`` for hashes already on disk: ``path`` holds little-endian uint64
        hashes, document ``offsets[j]``..``offsets[j + 1]`` of it belongs to
        ``doc_ids[j]`` (-1: to no document; its hashes are stored but never read). The
        bytes are appended by the kernel (``copy_file_range``), not read into Python."""
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) != len(doc_ids) + 1:
            raise ValueError("offsets must have one entry more than doc_ids")
        size = os.path.getsize(path)
        if size != 8 * int(offsets[-1] if len(offsets) else 0):
            raise ValueError(f"{path}: {size} bytes, offsets say {8 * int(offsets[-1])}")
        with open(path, "rb") as src, self._hashes.open("r+b") as dst:
            dst.seek(0, os.SEEK_END)  # (copy_file_range refuses files opened to append)
            _copy(src, dst, size)
        base = self.shingles
        self.shingles += size // 8
        keep = doc_ids >= 0
        if keep.any():
            self._set_slots(doc_ids[keep], base + offsets[:-1][keep], base + offsets[1:][keep])

    def _set_slots(self, doc_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        if int(doc_ids.min()) < 0 or len(np.unique(doc_ids)) != len(doc_ids):
            raise ValueError("document ids must be distinct and >= 0")
        slots = np.empty((len(doc_ids), 2), dtype="<i8")
        slots[:, 0] = starts
        slots[:, 1] = ends
        self._maps = None
        size = int(doc_ids.max()) + 1
        if size > self.documents:  # new slots read as (0, 0): empty sets
            with self._slots.open("r+b") as f:
                f.truncate(16 * size)
            self.documents = size
        lo = int(doc_ids[0])
        if int(doc_ids[-1]) - lo == len(doc_ids) - 1 and (np.diff(doc_ids) == 1).all():
            with self._slots.open("r+b") as f:  # the usual case: one contiguous write
                f.seek(16 * lo)
                f.write(slots.tobytes())
        else:
            table = np.memmap(self._slots, dtype="<i8", mode="r+", shape=(self.documents, 2))
            table[doc_ids] = slots
            table.flush()
            del table

    def _slot_table(self) -> np.ndarray:
        if self._maps is None:
            if self.documents:
                self._maps = np.memmap(
                    self._slots, dtype="<i8", mode="r", shape=(self.documents, 2)
                )
            else:
                self._maps = np.zeros((0, 2), dtype=np.int64)
        return self._maps

    def _read(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(buffer, where each range starts in it): the hash ranges read from disk.

        Ranges are sorted and those less than ``_READ_GAP`` apart merged, so documents
        stored near each other cost one read. Reads go to the heap and are freed with the
        chunk; a memory map would keep every touched page resident, and the kernel maps
        64 KB around each touched page of a cached file (measured), which made resident
        memory grow with the store rather than with the pairs being compared.
        """
        local = np.zeros(len(starts), dtype=np.int64)
        used = np.flatnonzero(lengths > 0)
        if len(used) == 0:
            return np.zeros(0, dtype=np.uint64), local
        begin = starts[used]
        order = np.argsort(begin, kind="stable")
        begin = begin[order]
        end = begin + lengths[used][order]
        reach = np.maximum.accumulate(end)
        cut = np.ones(len(begin), dtype=bool)
        cut[1:] = begin[1:] > reach[:-1] + _READ_GAP
        first = np.flatnonzero(cut)
        block = np.cumsum(cut) - 1
        block_start = begin[first]
        block_len = np.maximum.reduceat(end, first) - block_start
        base = np.zeros(len(first) + 1, dtype=np.int64)
        np.cumsum(block_len, out=base[1:])
        buf = np.empty(int(base[-1]), dtype="<u8")
        with self._hashes.open("rb", buffering=0) as f:
            for at, size, into in zip(
                block_start.tolist(), block_len.tolist(), base[:-1].tolist(), strict=True
            ):
                f.seek(8 * at)
                view = memoryview(buf[into : into + size]).cast("B")
                if f.readinto(view) != 8 * size:
                    raise OSError(f"{self._hashes}: short read")
        placed = np.empty(len(begin), dtype=np.int64)
        placed[order] = base[block] + (begin - block_start[block])
        local[used] = placed
        return buf, local

    def get(self, doc: int) -> np.ndarray:
        if not 0 <= doc < self.documents:
            return np.zeros(0, dtype=np.uint64)
        start, end = (int(v) for v in self._slot_table()[doc])
        buf, at = self._read(np.array([start]), np.array([end - start]))
        return np.unique(buf[at[0] : at[0] + end - start])

    def jaccard(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """Exact |A & B| / |A | B| of the stored sets of each pair (two empty sets: 1.0).

        Vectorized per chunk of pairs: both sets of every pair are gathered, tagged with
        the pair and the side, and sorted by (pair, hash); each run of equal hashes is one
        element of the union, and of the intersection when both sides are in it.
        """
        left = np.asarray(left, dtype=np.int64)
        right = np.asarray(right, dtype=np.int64)
        if left.shape != right.shape:
            raise ValueError("left and right must have the same shape")
        out = np.ones(len(left), dtype=np.float64)
        if len(left) == 0:
            return out
        slots = self._slot_table()
        known = self.documents

        def span(docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if not known:
                return np.zeros(len(docs), np.int64), np.zeros(len(docs), np.int64)
            inside = (docs >= 0) & (docs < known)
            rows = np.asarray(slots[np.where(inside, docs, 0)])
            return rows[:, 0], np.where(inside, rows[:, 1] - rows[:, 0], 0)

        ls, la = span(left)
        rs, ra = span(right)
        cost = np.cumsum(la + ra)
        lo = 0
        while lo < len(left):
            base = int(cost[lo - 1]) if lo else 0
            hi = int(np.searchsorted(cost, base + _JACCARD_ELEMS, side="right"))
            hi = min(max(hi, lo + 1), len(left), lo + (1 << 16))
            sl = slice(lo, hi)
            m = hi - lo
            buf, at = self._read(np.concatenate([ls[sl], rs[sl]]), np.concatenate([la[sl], ra[sl]]))
            inter, union = _overlaps(buf, at[:m], la[sl], at[m:], ra[sl])
            out[sl] = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
            lo = hi
        return out


def _overlaps(
    hashes: np.ndarray, ls: np.ndarray, la: np.ndarray, rs: np.ndarray, ra: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(|A & B|, |A | B|) of distinct hashes for each pair; at most 2^16 pairs at once."""
    n = len(la)
    values = np.concatenate([hashes[_ranges(ls, la)], hashes[_ranges(rs, ra)]])
    pair = np.arange(n, dtype=np.uint16)
    tags = np.concatenate([np.repeat(pair, la), np.repeat(pair, ra)])
    right = np.zeros(len(values), dtype=bool)
    right[int(la.sum()) :] = True
    if len(values) == 0:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    # Sort by value, then stably by pair: the stable sort of uint16 tags is a radix sort.
    order = np.argsort(values)
    order = order[np.argsort(tags[order], kind="stable")]
    values, tags, right = values[order], tags[order], right[order]
    new_run = np.ones(len(values), dtype=bool)
    new_run[1:] = (values[1:] != values[:-1]) | (tags[1:] != tags[:-1])
    run = np.cumsum(new_run) - 1
    n_runs = int(run[-1]) + 1
    has_left = np.zeros(n_runs, dtype=bool)
    has_right = np.zeros(n_runs, dtype=bool)
    has_left[run[~right]] = True
    has_right[run[right]] = True
    run_tag = tags[new_run]
    union = np.bincount(run_tag, minlength=n)
    inter = np.bincount(run_tag[has_left & has_right], minlength=n)
    return inter, union
