"""The one record type every corpus reader yields, and its Parquet/Arrow form.

Readers stream ``Document`` values; shards store them as Arrow tables with a fixed
schema so that a dataset version written today can be read back field for field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Document:
    """One training document; ``meta`` is a JSON string so the schema never has to change."""

    id: str
    text: str
    source: str
    domain: str
    lang: str | None = None
    date: str | None = None
    meta: str | None = None


_REQUIRED = ("id", "text", "source", "domain")
_OPTIONAL = ("lang", "date", "meta")
_FIELDS = _REQUIRED + _OPTIONAL

DOCUMENT_SCHEMA = pa.schema(
    [pa.field(name, pa.string(), nullable=False) for name in _REQUIRED]
    + [pa.field(name, pa.string(), nullable=True) for name in _OPTIONAL]
)


def documents_to_table(docs: Iterable[Document]) -> pa.Table:
    """A generator works as well as a list (it is read once)."""
    docs = docs if isinstance(docs, list) else list(docs)
    columns = {
        "id": [d.id for d in docs],
        "text": [d.text for d in docs],
        "source": [d.source for d in docs],
        "domain": [d.domain for d in docs],
        "lang": [d.lang for d in docs],
        "date": [d.date for d in docs],
        "meta": [d.meta for d in docs],
    }
    return pa.Table.from_pydict(columns, schema=DOCUMENT_SCHEMA)


def table_to_documents(table: pa.Table) -> Iterator[Document]:
    """Goes batch by batch so a large shard is never copied to Python objects at once."""
    missing = [name for name in _REQUIRED if name not in table.column_names]
    if missing:
        raise ValueError(f"table lacks document columns: {', '.join(missing)}")
    present = [name for name in _FIELDS if name in table.column_names]
    for batch in table.select(present).to_batches():
        columns = [batch.column(name).to_pylist() for name in present]
        if len(present) == len(_FIELDS):  # positional: the fields in their order
            for values in zip(*columns, strict=True):
                yield Document(*values)
        else:
            for values in zip(*columns, strict=True):
                yield Document(**dict(zip(present, values, strict=True)))


@dataclass
class ReadStats:
    """What a reader left out or changed, so a data report can say so instead of hiding it."""

    files_seen: int = 0
    skipped_not_utf8: list[str] = field(default_factory=list)
    truncated: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
