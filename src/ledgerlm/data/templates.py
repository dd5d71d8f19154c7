"""Template line removal (requirement D2): banners, headers, footers and navigation repeated
across many documents of one source.

Two passes so that it streams. Pass 1 (``LineCounter``) counts, per source, in how many
documents each distinct line occurs; shards count in parallel and the counters merge by
addition. ``template_lines`` turns the merged counts into per-source sets of line keys.
Pass 2 (``TemplateRemover``) drops those lines from each document, shard by shard.

Thresholds are per source: a licence banner in 2 of 10 000 web pages is content quoted
twice, while the same banner in 90 % of one mailing-list archive is boilerplate. Lines are
identified by a 64-bit hash, so pass 1 never holds text; with 8-byte keys, a collision
between two distinct lines is expected only after ~4 billion distinct lines per source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ledgerlm.config import TemplatesConfig
from ledgerlm.data.records import Document

_EMPTY_KEYS = np.zeros(0, dtype=np.uint64)
_EMPTY_COUNTS = np.zeros(0, dtype=np.int64)


def line_key(line: str) -> int:
    """Stable across processes and Python versions, unlike ``hash`` (salted per process).

    Lines are split on ``\\n`` only and compared without surrounding whitespace, so a
    ``\\r\\n`` file and an indented copy of the same banner share a key.
    """
    data = line.strip().encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def line_keys(stripped: Iterable[str]) -> np.ndarray:
    """``line_key`` of lines already stripped, as one uint64 array. (A numpy hash of all
    lines at once measured no faster than one blake2b call per line: the join, encode
    and length passes cost what the calls do.)"""
    digests = b"".join(
        hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        for s in stripped
    )
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def qualifying_lines(text: str, min_line_chars: int) -> set[str]:
    """The distinct stripped lines of a text that are long enough to be templates."""
    return {s for s in map(str.strip, text.split("\n")) if len(s) >= min_line_chars}


def _merge_sorted(
    keys_a: np.ndarray, counts_a: np.ndarray, keys_b: np.ndarray, counts_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Sum two (key, count) tables; the result is sorted by key and has unique keys."""
    if not keys_a.size:
        return keys_b, counts_b
    if not keys_b.size:
        return keys_a, counts_a
    keys = np.concatenate([keys_a, keys_b])
    counts = np.concatenate([counts_a, counts_b])
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse.ravel(), weights=counts, minlength=uniq.size).astype(np.int64)


class LineCounter:
    """Pass 1: per source, the number of documents each distinct qualifying line occurs in.

    Memory grows with the number of distinct qualifying lines per source, not with text:
    after ``compact()`` each costs 16 bytes (a uint64 key and an int64 count in sorted
    numpy arrays); lines added since the last compaction are counted by their text in a
    ``Counter`` (one C loop per document; each distinct line is hashed once, when the
    counter compacts) at roughly 150 bytes each, which is why the counter compacts itself
    every ``compact_every`` pending lines. Most lines of a real corpus are unique, so
    expect about 16 bytes per line of the corpus; counting sources one at a time bounds
    the peak if that is too much. Documents of excluded domains are not counted at all:
    their repeated lines are content (code, math), and they never reach pass 2's
    removal anyway.
    """

    def __init__(
        self,
        min_line_chars: int = 20,
        exclude_domains: Iterable[str] = (),
        compact_every: int = 1 << 18,
    ) -> None:
        self.min_line_chars = min_line_chars
        self.exclude_domains = frozenset(exclude_domains)
        self.compact_every = compact_every
        self._docs: dict[str, int] = {}
        self._pending: dict[str, Counter[str]] = {}
        self._pending_size = 0
        self._keys: dict[str, np.ndarray] = {}
        self._counts: dict[str, np.ndarray] = {}

    @classmethod
    def from_config(cls, cfg: TemplatesConfig) -> LineCounter:
        return cls(cfg.min_line_chars, cfg.exclude_domains)

    def add(self, doc: Document) -> None:
        if doc.domain in self.exclude_domains:
            return
        self._docs[doc.source] = self._docs.get(doc.source, 0) + 1
        pending = self._pending.get(doc.source)
        if pending is None:
            pending = self._pending[doc.source] = Counter()
        before = len(pending)
        pending.update(qualifying_lines(doc.text, self.min_line_chars))
        self._pending_size += len(pending) - before
        if self._pending_size >= self.compact_every:
            self.compact()

    def compact(self) -> LineCounter:
        """Fold the pending lines into the sorted arrays (16 bytes per distinct line)."""
        for source, pending in self._pending.items():
            if not pending:
                continue
            keys = line_keys(pending.keys())
            counts = np.fromiter(pending.values(), dtype=np.int64, count=len(pending))
            keys, inverse = np.unique(keys, return_inverse=True)  # sorted, distinct
            counts = np.bincount(inverse.ravel(), weights=counts, minlength=keys.size)
            self._keys[source], self._counts[source] = _merge_sorted(
                self._keys.get(source, _EMPTY_KEYS),
                self._counts.get(source, _EMPTY_COUNTS),
                keys,
                counts.astype(np.int64),
            )
        self._pending = {}
        self._pending_size = 0
        return self

    def merge(self, other: LineCounter) -> LineCounter:
        """Addition of counts, so shards may merge in any order and any grouping."""
        if other.min_line_chars != self.min_line_chars:
            raise ValueError("line counters with different min_line_chars cannot merge")
        self.compact()
        other_keys, other_counts = other._tables()
        for source, n in other._docs.items():
            self._docs[source] = self._docs.get(source, 0) + n
        for source, keys in other_keys.items():
            self._keys[source], self._counts[source] = _merge_sorted(
                self._keys.get(source, _EMPTY_KEYS),
                self._counts.get(source, _EMPTY_COUNTS),
                keys,
                other_counts[source],
            )
        return self

    def _tables(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Compacted (keys, counts) per source, without mutating a counter we do not own."""
        if not any(self._pending.values()):
            return self._keys, self._counts
        copy = LineCounter(self.min_line_chars, self.exclude_domains, self.compact_every)
        copy._keys, copy._counts = dict(self._keys), dict(self._counts)
        copy._pending = self._pending
        copy.compact()
        return copy._keys, copy._counts

    # -- reading -------------------------------------------------------------------------

    def sources(self) -> list[str]:
        return sorted(self._docs)

    def docs(self, source: str) -> int:
        return self._docs.get(source, 0)

    def counts(self, source: str) -> dict[int, int]:
        """Key -> document count for one source (for tests and reports, not the hot path)."""
        keys, counts = self._tables()
        k, c = keys.get(source, _EMPTY_KEYS), counts.get(source, _EMPTY_COUNTS)
        return dict(zip(k.tolist(), c.tolist(), strict=True))

    def keys_at_least(self, source: str, min_docs: int) -> set[int]:
        keys, counts = self._tables()
        k, c = keys.get(source, _EMPTY_KEYS), counts.get(source, _EMPTY_COUNTS)
        return set(k[c >= min_docs].tolist())

    def nbytes(self) -> int:
        """Bytes held by the compacted arrays (pending dict entries are not included)."""
        arrays = [*self._keys.values(), *self._counts.values()]
        return sum(int(a.nbytes) for a in arrays)


def min_docs_for(docs_in_source: int, cfg: TemplatesConfig) -> int:
    """Both bounds must hold: an absolute floor for small sources, a share for large ones.

    The tiny epsilon keeps ``0.05 * 20`` (1.0000000000000002 in floating point) from
    rounding up to 2.
    """
    return max(cfg.min_docs, math.ceil(cfg.min_doc_fraction * docs_in_source - 1e-9))


def template_lines(counter: LineCounter, cfg: TemplatesConfig) -> dict[str, set[int]]:
    """Per source (every counted one, possibly with an empty set), its template line keys."""
    if not cfg.enabled:
        return {}
    return {
        source: counter.keys_at_least(source, min_docs_for(counter.docs(source), cfg))
        for source in counter.sources()
    }


def shard_template_lines(
    counters: list[LineCounter], cfg: TemplatesConfig, ranges: int = 16
) -> dict[str, set[int]]:
    """``template_lines`` of the sum of many counters (one per shard), without building
    the sum: per source and per range of keys (each counter's keys are sorted, so a
    range is a slice of each), the slices are concatenated, counted and thresholded.
    Peak memory is the counters plus 1/``ranges`` of their keys, where summing them
    first held all their keys twice; and the sorted runs merge in one stable sort."""
    if not cfg.enabled:
        return {}
    docs: dict[str, int] = {}
    tables = []
    for c in counters:
        for source, n in c._docs.items():
            docs[source] = docs.get(source, 0) + n
        tables.append(c._tables())
    bounds = [np.uint64(int(r * 2**64 / ranges)) for r in range(1, ranges)]
    out: dict[str, set[int]] = {}
    for source in sorted(docs):
        least = min_docs_for(docs[source], cfg)
        found: list[np.ndarray] = []
        cuts = [
            (keys[source], counts[source], np.searchsorted(keys[source], bounds))
            for keys, counts in tables
            if source in keys
        ]
        for r in range(ranges):
            parts = [(k[a:b], c[a:b]) for k, c, at in cuts for a, b in [_span(at, r, len(k))]]
            k = np.concatenate([p[0] for p in parts]) if parts else _EMPTY_KEYS
            if not k.size:
                continue
            order = np.argsort(k, kind="stable")  # merges the sorted runs
            k = k[order]
            first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
            total = np.add.reduceat(np.concatenate([p[1] for p in parts])[order], first)
            found.append(k[first][total >= least])
        out[source] = set(np.concatenate(found).tolist()) if found else set()
    return out


def _span(at: np.ndarray, r: int, n: int) -> tuple[int, int]:
    return (int(at[r - 1]) if r else 0), (int(at[r]) if r < len(at) else n)


_EXAMPLES = 5


class TemplateStats:
    """Per-source counts of pass 2, mergeable by addition and JSON-able.

    ``examples`` keeps the text of up to five removed lines per source, chosen as the ones
    with the smallest keys so that the choice does not depend on shard order.
    """

    FIELDS = ("docs_seen", "docs_excluded", "docs_touched", "lines_removed", "chars_removed")

    def __init__(self) -> None:
        self.sources: dict[str, dict[str, int]] = {}
        self.examples: dict[str, dict[int, str]] = {}

    def _row(self, source: str) -> dict[str, int]:
        row = self.sources.get(source)
        if row is None:
            row = self.sources[source] = dict.fromkeys(self.FIELDS, 0)
        return row

    def _example(self, source: str, key: int, line: str) -> None:
        ex = self.examples.setdefault(source, {})
        if key in ex or (len(ex) >= _EXAMPLES and key > max(ex)):
            return
        ex[key] = line
        if len(ex) > _EXAMPLES:
            del ex[max(ex)]

    def merge(self, other: TemplateStats) -> TemplateStats:
        for source, row in other.sources.items():
            mine = self._row(source)
            for name, n in row.items():
                mine[name] = mine.get(name, 0) + n
        for source, ex in other.examples.items():
            for key, line in ex.items():
                self._example(source, key, line)
        return self

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for source in sorted(self.sources):
            row: dict[str, Any] = dict(self.sources[source])
            row["examples"] = [
                self.examples[source][k] for k in sorted(self.examples.get(source, {}))
            ]
            out[source] = row
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TemplateStats:
        """Examples come back without their keys; they are re-keyed by hashing the line."""
        stats = cls()
        for source, row in data.items():
            stats.sources[source] = {name: int(row.get(name, 0)) for name in cls.FIELDS}
            for line in row.get("examples", []):
                stats._example(source, line_key(line), line)
        return stats

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TemplateStats):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


class TemplateRemover:
    """Pass 2: removes a source's template lines from each of its documents.

    Everything else stays byte for byte: other lines, their order, blank lines and line
    endings. Only a removed line's own text and its ``\\n`` go. A document that loses
    nothing is returned as the same object, so callers can tell cheaply.
    """

    name = "templates"

    def __init__(
        self,
        templates: Mapping[str, Iterable[int]],
        exclude_domains: Iterable[str] = (),
        min_line_chars: int = 1,
    ) -> None:
        self.templates = {source: frozenset(keys) for source, keys in templates.items() if keys}
        self.exclude_domains = frozenset(exclude_domains)
        self.min_line_chars = max(1, min_line_chars)
        self.stats = TemplateStats()

    @classmethod
    def from_config(
        cls, templates: Mapping[str, Iterable[int]], cfg: TemplatesConfig
    ) -> TemplateRemover:
        return cls(templates, cfg.exclude_domains, cfg.min_line_chars)

    def params(self) -> dict[str, Any]:
        return {
            "exclude_domains": sorted(self.exclude_domains),
            "min_line_chars": self.min_line_chars,
            "template_lines": {s: len(k) for s, k in sorted(self.templates.items())},
            "hash": "blake2b-64 of the stripped line",
        }

    def apply(self, doc: Document) -> tuple[Document, int, int]:
        """(document, lines removed, characters removed = len(before) - len(after))."""
        row = self.stats._row(doc.source)
        row["docs_seen"] += 1
        if doc.domain in self.exclude_domains:
            row["docs_excluded"] += 1
            return doc, 0, 0
        keys = self.templates.get(doc.source)
        if not keys:
            return doc, 0, 0
        lines = doc.text.split("\n")
        kept: list[str] = []
        removed = 0
        for line in lines:
            stripped = line.strip()
            if len(stripped) >= self.min_line_chars:
                key = line_key(stripped)
                if key in keys:
                    removed += 1
                    self.stats._example(doc.source, key, stripped)
                    continue
            kept.append(line)
        if not removed:
            return doc, 0, 0
        text = "\n".join(kept)
        chars = len(doc.text) - len(text)
        row["docs_touched"] += 1
        row["lines_removed"] += removed
        row["chars_removed"] += chars
        return dataclasses.replace(doc, text=text), removed, chars
