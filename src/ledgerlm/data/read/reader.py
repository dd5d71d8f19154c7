"""``read_shard``: a shard's records, read by the reader of its format."""

from __future__ import annotations

from collections.abc import Iterator

from ledgerlm.config import BuiltinCorpusConfig
from ledgerlm.data.builtin import read_builtin
from ledgerlm.data.read.columnar import read_arrow, read_parquet
from ledgerlm.data.read.jsonl import read_jsonl
from ledgerlm.data.read.shard import BUILTIN_STDLIB, Quarantined, ReaderError, Shard
from ledgerlm.data.read.text import read_text
from ledgerlm.data.records import Document, ReadStats


def _read_builtin(builtin: BuiltinCorpusConfig) -> Iterator[Document | Quarantined]:
    """Built-in documents, then one quarantine entry per stdlib file that is not UTF-8."""
    stats = ReadStats()
    yield from read_builtin(builtin, stats)
    for rel in stats.skipped_not_utf8:
        yield Quarantined(f"{BUILTIN_STDLIB}/{rel}", None, "invalid_utf8", "")


def read_shard(shard: Shard, builtin: BuiltinCorpusConfig) -> Iterator[Document | Quarantined]:
    """One output per record, in file order, so callers can count and resume by position."""
    if shard.format == "jsonl":
        return read_jsonl(shard)
    if shard.format == "parquet":
        return read_parquet(shard)
    if shard.format == "arrow":
        return read_arrow(shard)
    if shard.format == "text":
        return read_text(shard)
    if shard.format == "builtin":
        return _read_builtin(builtin)
    raise ReaderError(f"input '{shard.source}': unknown format '{shard.format}'")
