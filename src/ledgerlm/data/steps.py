"""The contract of a data step, and the per-group counters every step reports (requirement D3).

A pass rate alone hides who paid for it: a filter that drops 3 % overall may drop 60 % of
one language or of one year. So every step counts what it saw and what it dropped per
group (source, domain, language, length bucket, date bucket) with a reason per drop.

Shards are processed in separate worker processes, so the counters are plain dicts of
tuples and ints (they pickle), merging is addition (order does not matter), and every
output is sorted so two runs over the same shards give byte-identical reports.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ledgerlm.data.records import Document

Group = tuple[str, str, str, str, str]
"""(source, domain, lang, length_bucket, date_bucket)."""

GROUP_FIELDS = ("source", "domain", "lang", "length_bucket", "date_bucket")

# Upper bounds (exclusive) and labels; decades of characters separate a tweet from a page
# from a book, which is the distinction a report needs.
_LENGTH_EDGES: tuple[tuple[int, str], ...] = (
    (100, "<100"),
    (1_000, "100-1k"),
    (10_000, "1k-10k"),
    (100_000, "10k-100k"),
)
_LENGTH_TOP = ">=100k"
LENGTH_BUCKETS: tuple[str, ...] = (*(label for _, label in _LENGTH_EDGES), _LENGTH_TOP)
_LENGTH_RANK = {label: i for i, label in enumerate(LENGTH_BUCKETS)}

_YEAR = re.compile(r"[0-9]{4}")
UNKNOWN = "unknown"


@runtime_checkable
class Filter(Protocol):
    """A document filter: pure, picklable, and honest about why it drops.

    ``check`` returns None to keep a document, else a short reason slug (``too_short``)
    that ends up in the report next to the group it came from. The data stage calls
    ``check_batch``; a filter subclasses this protocol to inherit its default, and
    overrides it when a batch is cheaper at once (the repetition filter's n-gram shares).
    """

    name: str

    def params(self) -> dict[str, Any]: ...

    def check(self, doc: Document) -> str | None: ...

    def check_batch(self, docs: list[Document]) -> list[str | None]:
        """``check`` of every document, in order."""
        return [self.check(doc) for doc in docs]


def length_bucket(chars: int) -> str:
    for edge, label in _LENGTH_EDGES:
        if chars < edge:
            return label
    return _LENGTH_TOP


def date_bucket(date: str | None) -> str:
    """Years only: finer buckets would split small corpora into groups too small to read."""
    if date and _YEAR.match(date):
        return date[:4]
    return UNKNOWN


def group_of(doc: Document) -> Group:
    return (
        doc.source,
        doc.domain,
        doc.lang or UNKNOWN,
        length_bucket(len(doc.text)),
        date_bucket(doc.date),
    )


def _group_sort_key(group: Group) -> tuple[Any, ...]:
    """Length buckets sort by size, not alphabetically, so a report reads short to long."""
    source, domain, lang, lb, db = group
    return (source, domain, lang, _LENGTH_RANK.get(lb, len(LENGTH_BUCKETS)), lb, db)


# Index of each counter in the per-(step, group) list.
_SEEN, _SEEN_CHARS, _DROPPED, _DROPPED_CHARS = range(4)


class GroupStats:
    """Counters keyed by (step, group) plus drop reasons keyed by (step, group, reason).

    Kept documents are not stored: they are ``docs_seen - docs_dropped``, which makes the
    conservation law hold by construction instead of by bookkeeping discipline.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, Group], list[int]] = {}
        self._reasons: dict[tuple[str, Group, str], int] = {}

    # -- recording ---------------------------------------------------------------------

    def _cell(self, step: str, group: Group) -> list[int]:
        cell = self._counts.get((step, group))
        if cell is None:
            cell = self._counts[(step, group)] = [0, 0, 0, 0]
        return cell

    def seen(self, step: str, doc: Document, group: Group | None = None) -> None:
        cell = self._cell(step, group or group_of(doc))
        cell[_SEEN] += 1
        cell[_SEEN_CHARS] += len(doc.text)

    def dropped(self, step: str, doc: Document, reason: str, group: Group | None = None) -> None:
        """Call after ``seen`` for the same document; the reason is required on purpose."""
        if not reason:
            raise ValueError(f"step {step!r}: a drop needs a reason")
        group = group or group_of(doc)
        cell = self._cell(step, group)
        cell[_DROPPED] += 1
        cell[_DROPPED_CHARS] += len(doc.text)
        key = (step, group, reason)
        self._reasons[key] = self._reasons.get(key, 0) + 1

    def merge(self, other: GroupStats) -> GroupStats:
        for key, cell in other._counts.items():
            mine = self._counts.get(key)
            if mine is None:
                self._counts[key] = list(cell)
            else:
                for i, value in enumerate(cell):
                    mine[i] += value
        for key, n in other._reasons.items():
            self._reasons[key] = self._reasons.get(key, 0) + n
        return self

    # -- reporting ---------------------------------------------------------------------

    def steps(self) -> list[str]:
        return sorted({step for step, _ in self._counts})

    def rows(self) -> list[dict[str, Any]]:
        reasons: dict[tuple[str, Group], dict[str, int]] = {}
        for (step, group, reason), n in self._reasons.items():
            reasons.setdefault((step, group), {})[reason] = n
        out: list[dict[str, Any]] = []
        for step, group in sorted(self._counts, key=lambda k: (k[0], _group_sort_key(k[1]))):
            cell = self._counts[(step, group)]
            row: dict[str, Any] = {"step": step}
            row.update(zip(GROUP_FIELDS, group, strict=True))
            row.update(
                docs_seen=cell[_SEEN],
                chars_seen=cell[_SEEN_CHARS],
                docs_dropped=cell[_DROPPED],
                chars_dropped=cell[_DROPPED_CHARS],
                reasons=dict(sorted(reasons.get((step, group), {}).items())),
            )
            out.append(row)
        return out

    def totals(self) -> dict[str, dict[str, Any]]:
        acc: dict[str, dict[str, Any]] = {}
        for row in self.rows():
            t = acc.setdefault(
                row["step"],
                {"docs_seen": 0, "docs_dropped": 0, "chars_seen": 0, "chars_dropped": 0},
            )
            for name in ("docs_seen", "docs_dropped", "chars_seen", "chars_dropped"):
                t[name] += row[name]
            reasons = t.setdefault("reasons", {})
            for reason, n in row["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + n
        for t in acc.values():
            t["reasons"] = dict(sorted(t.get("reasons", {}).items()))
        return dict(sorted(acc.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupStats):
            return NotImplemented
        return self.rows() == other.rows()

    __hash__ = None  # type: ignore[assignment]


def apply_filters_batch(
    filters: Sequence[Filter], docs: Sequence[Document], stats: GroupStats
) -> list[tuple[str, str] | None]:
    """Run the filters in order over a batch; for each document, (filter name, reason) of
    the first that drops it, or None. Each filter gets the survivors of the ones before
    it in one ``check_batch`` call.

    A filter only sees the documents that earlier filters kept, so its counts are
    conditional on the order; the order is therefore fixed (``build_filters``) and part
    of the recipe, and each filter's ``docs_seen`` makes the conditioning visible.
    """
    groups = [group_of(doc) for doc in docs]
    out: list[tuple[str, str] | None] = [None] * len(docs)
    alive = list(range(len(docs)))
    for f in filters:
        if not alive:
            break
        for i in alive:
            stats.seen(f.name, docs[i], groups[i])
        reasons = f.check_batch([docs[i] for i in alive])
        still = []
        for i, reason in zip(alive, reasons, strict=True):
            if reason is None:
                still.append(i)
            else:
                stats.dropped(f.name, docs[i], reason, groups[i])
                out[i] = (f.name, reason)
        alive = still
    return out
