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


class _NoPandas:
    """An import finder that refuses pandas (see ``skip_pandas_probe``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("not while pyarrow probes for it")


def skip_pandas_probe() -> None:
    """Keep pyarrow from importing pandas in a process that never gives it pandas objects.

    pyarrow imports pandas, when installed, the first time it converts a Python list,
    only to ask whether the list is a pandas object: 0.3-0.5 s per process, measured as
    most of preparing a 1 MB corpus. This makes that first probe find no pandas. Asked
    for explicitly later (``to_pandas``, ``from_pandas``), pyarrow still imports it, and
    ``pa.table(df)`` still works; only its implicit detection of pandas values (e.g. a
    ``Categorical`` as a dictionary array) stays off. So only processes that exist to run
    the data stage call this: its workers and ``ledgerlm data prepare``.
    """
    import sys

    if "pandas" in sys.modules:
        return  # already paid for, and someone uses it
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([""])
    finally:
        sys.meta_path.remove(finder)


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
