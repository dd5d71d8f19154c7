"""Parquet and Arrow IPC rows, read batch by batch, never the whole table."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.data.read.fields import to_document
from ledgerlm.data.read.files import Unreadable, open_regular, unreadable_record
from ledgerlm.data.read.shard import SNIPPET_CHARS, Quarantined, Shard, id_prefix, shard_label
from ledgerlm.data.records import Document

_PARQUET_BATCH_ROWS = 1024


def read_parquet(shard: Shard) -> Iterator[Document | Quarantined]:
    """Rows in order; a file that is not Parquet is one quarantined record, and each row
    of a file without the source's text column is quarantined (``no_text_column``)."""

    def batches(raw: BinaryIO) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        pf = pq.ParquetFile(raw)
        groups = None
        if shard.start or shard.stop is not None:  # a piece: a run of row groups
            stop = pf.metadata.num_row_groups if shard.stop is None else shard.stop
            groups = range(shard.start, stop)
        return pf.schema_arrow, pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=groups)

    return _read_columnar(shard, "Parquet", batches)


def read_arrow(shard: Shard) -> Iterator[Document | Quarantined]:
    """Rows of an Arrow IPC file (stream or file format, as ``datasets`` writes them),
    read like Parquet's: batch by batch, never the whole table."""
    return _read_columnar(shard, "Arrow", _arrow_batches)


def _read_columnar(
    shard: Shard,
    kind: str,
    batches_of: Callable[[BinaryIO], tuple[pa.Schema, Iterator[pa.RecordBatch]]],
) -> Iterator[Document | Quarantined]:
    row = shard.first - 1
    try:
        raw = open_regular(shard.path)
    except Unreadable as err:
        yield unreadable_record(shard, None, err)
        return
    with raw:
        try:
            schema, batches = batches_of(raw)
        except (pa.ArrowException, OSError, ValueError) as err:
            detail = f"not a readable {kind} file: {err}"[:SNIPPET_CHARS]
            yield Quarantined(shard_label(shard), None, "corrupt_stream", detail)
            return
        has_text = shard.fields[0] in schema.names
        try:
            for batch in batches:
                for record in batch.to_pylist():
                    row += 1
                    yield _parquet_record(shard, row, record, has_text)
        except (pa.ArrowException, OSError, ValueError) as err:
            yield Quarantined(
                shard_label(shard), row + 1, "corrupt_stream", str(err)[:SNIPPET_CHARS]
            )


def _parquet_record(
    shard: Shard, row: int, record: dict[str, Any], has_text: bool = True
) -> Document | Quarantined:
    if has_text:
        result = to_document(record, shard, f"{id_prefix(shard)}:{row}")
    else:
        result = "no_text_column"
    if isinstance(result, str):
        shown = json.dumps(record, ensure_ascii=False, default=str)[:SNIPPET_CHARS]
        return Quarantined(shard_label(shard), row, result, shown)
    return result


def _arrow_batches(raw: BinaryIO) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and record batches of an Arrow IPC stream, or else of an IPC file."""
    try:
        stream = pa.ipc.open_stream(raw)
        return stream.schema, iter(stream)
    except pa.ArrowInvalid:
        raw.seek(0)
        file = pa.ipc.open_file(raw)
        return file.schema, (file.get_batch(i) for i in range(file.num_record_batches))
