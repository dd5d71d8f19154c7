"""JSONL records, line by line: orjson where it reads what ``json`` reads, else ``json``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ledgerlm.data.read.fields import to_document
from ledgerlm.data.read.files import Unreadable, open_regular, unreadable_record
from ledgerlm.data.read.shard import (
    SNIPPET_CHARS,
    Quarantined,
    Shard,
    id_prefix,
    shard_label,
    snippet_of,
)
from ledgerlm.data.read.streams import (
    CorruptStream,
    compressed_prefix,
    decoded_chunks,
    range_chunks,
    split_lines,
)
from ledgerlm.data.records import Document


def read_jsonl(shard: Shard) -> Iterator[Document | Quarantined]:
    lineno = shard.first - 1
    used = 0  # decoded bytes of the complete lines read
    try:
        with open_regular(shard.path) as f:
            if shard.start or shard.stop is not None:  # a piece of a plain file
                chunks = range_chunks(f, shard.start, shard.stop)
            else:
                chunks = decoded_chunks(f, shard.path)
            record = _jsonl_record
            for lineno, raw in enumerate(split_lines(chunks), start=shard.first):
                used += len(raw) + 1
                if raw.strip():
                    yield record(shard, lineno, raw)
    except CorruptStream as err:
        size = os.path.getsize(shard.path)
        unread = size - compressed_prefix(shard.path, used)
        detail = f"{unread} of {size} compressed bytes not read; {err}"
        yield Quarantined(
            shard_label(shard), lineno + 1, "corrupt_stream", detail[:SNIPPET_CHARS], unread
        )
    except (Unreadable, OSError) as err:
        yield unreadable_record(shard, lineno + 1 if lineno else None, err)


_BOM = b"\xef\xbb\xbf"
_FLAT = (str, int, type(None))  # bool is an int


def _fast_record(raw: bytes, lineno: int) -> dict[str, Any] | None:
    """The record as ``json.loads`` would give it, parsed by orjson (~3x faster), or None
    when that cannot be sure: orjson failed (the slow path then names the reason, as it
    always did: orjson refuses lone surrogates, NaN and overlong numbers, which ``json``
    reads) or a value is not a string, integer, boolean or null (orjson reads an integer
    over 64 bits as a float, and nested values are left to ``json``)."""
    if _orjson_loads is None:
        return None
    try:
        record = _orjson_loads(raw[3:] if lineno == 1 and raw.startswith(_BOM) else raw)
    except ValueError:
        return None
    if type(record) is not dict:
        return None
    for value in record.values():
        if not isinstance(value, _FLAT):
            return None
    return record


try:  # optional: the standard library's json reads the same records, slower
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - depends on the install
    _orjson_loads = None


def _jsonl_record(shard: Shard, lineno: int, raw: bytes) -> Document | Quarantined:
    record = _fast_record(raw, lineno)
    if record is not None:
        result = to_document(record, shard, f"{id_prefix(shard)}:{lineno}")
        if isinstance(result, str):
            return Quarantined(shard_label(shard), lineno, result, snippet_of(raw))
        return result
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Quarantined(shard_label(shard), lineno, "invalid_utf8", snippet_of(raw))
    try:
        record = json.loads(line.removeprefix("\ufeff") if lineno == 1 else line)
    except (ValueError, RecursionError):
        return Quarantined(shard_label(shard), lineno, "bad_json", snippet_of(raw))
    if not isinstance(record, dict):
        return Quarantined(shard_label(shard), lineno, "not_an_object", snippet_of(raw))
    result = to_document(record, shard, f"{id_prefix(shard)}:{lineno}")
    if isinstance(result, str):
        return Quarantined(shard_label(shard), lineno, result, snippet_of(raw))
    return result
