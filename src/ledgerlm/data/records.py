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
    """Columns are built in one pass so a generator works as well as a list."""
    columns: dict[str, list[str | None]] = {name: [] for name in _FIELDS}
    for doc in docs:
        for name in _FIELDS:
            columns[name].append(getattr(doc, name))
    return pa.Table.from_pydict(columns, schema=DOCUMENT_SCHEMA)


def table_to_documents(table: pa.Table) -> Iterator[Document]:
    """Goes batch by batch so a large shard is never copied to Python objects at once."""
    missing = [name for name in _REQUIRED if name not in table.column_names]
    if missing:
        raise ValueError(f"table lacks document columns: {', '.join(missing)}")
    present = [name for name in _FIELDS if name in table.column_names]
    for batch in table.select(present).to_batches():
        for row in batch.to_pylist():
            yield Document(**row)


@dataclass
class ReadStats:
    """What a reader left out or changed, so a data report can say so instead of hiding it."""

    files_seen: int = 0
    skipped_not_utf8: list[str] = field(default_factory=list)
    truncated: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
