"""What a shard is, and what reading one yields besides documents: ``Quarantined``."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa

BUILTIN_STDLIB = "builtin:stdlib"
TEXT_SUFFIXES = (".txt", ".md")
SNIPPET_CHARS = 200
DEFAULT_FIELDS = ("text", "id", "domain")


class ReaderError(ValueError):
    """An input that cannot be read at all; the message is one line naming it and why."""


@dataclass(frozen=True)
class Shard:
    """One unit of parallel reading.

    ``rel`` is the path relative to the recipe base (POSIX), or ``""`` when it lies
    outside; ids and quarantine entries use it so they do not depend on where the
    project sits on disk.
    """

    index: int
    source: str
    format: str
    path: str
    files: tuple[str, ...] = ()
    domain: str | None = None
    rel: str = ""
    fields: tuple[str, str, str] = DEFAULT_FIELDS  # text, id, domain: JSONL and Parquet
    split: str = "file"  # text files: file, blank_lines, lines or chunk:N
    # A piece of one file (``split_shards``): bytes [start, stop) of a plain JSONL file, or
    # row groups [start, stop) of a Parquet file (stop None: to the end); ``first`` is the
    # number of its first line or row in the whole file, so ids and quarantine lines are
    # those of the file.
    start: int = 0
    stop: int | None = None
    first: int = 1
    date_field: str = "date"  # JSONL and Parquet
    # under data.split = "time": a record's date must parse (``parse_time``) or the record
    # is quarantined (``bad_date``); a Unix time becomes its ISO text
    dated: bool = False


@dataclass(frozen=True)
class Quarantined:
    """A record that could not become a document, kept so that nothing is lost silently."""

    file: str
    line: int | None
    reason: str
    snippet: str
    # compressed bytes after the last point a damaged stream was read to (not stored in
    # quarantine.parquet: the snippet says it, the manifest sums it)
    unread_bytes: int = 0


QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=True),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("snippet", pa.string(), nullable=False),
    ]
)


def quarantine_table(items: list[Quarantined]) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "file": [q.file for q in items],
            "line": [q.line for q in items],
            "reason": [q.reason for q in items],
            "snippet": [q.snippet for q in items],
        },
        schema=QUARANTINE_SCHEMA,
    )


def shard_label(shard: Shard) -> str:
    return shard.rel or shard.path


def id_prefix(shard: Shard) -> str:
    return f"{shard.source}:{shard.rel or os.path.basename(shard.path)}"


def snippet_of(raw: bytes) -> str:
    return raw[: SNIPPET_CHARS * 5].decode("utf-8", errors="replace")[:SNIPPET_CHARS]
