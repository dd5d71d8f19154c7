"""Big files cut into pieces, the work units of a build: plain JSONL files at line starts,
Parquet files at row-group boundaries."""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.data.executor import PIECE_BYTES as _PIECE_BYTES
from ledgerlm.data.read.files import READ_SIZE, Unreadable, open_regular
from ledgerlm.data.read.shard import Shard
from ledgerlm.data.read.streams import codec_of

# The size of the pieces big files are cut into (see ``executor.PIECE_BYTES``).
PIECE_BYTES = _PIECE_BYTES


def split_shards(shards: list[Shard], piece_bytes: int | None = None) -> list[Shard]:
    """The work units of a build: every plain (uncompressed) JSONL file cut at line
    starts, every Parquet file at row-group boundaries, about every ``piece_bytes``;
    other shards whole. Pieces are numbered 0, 1, ... in input order, and a piece reads
    exactly the records (same ids, lines and quarantine entries) that reading the whole
    file yields in its range. A file that cannot be scanned stays whole (its reader then
    quarantines it as one record). ``piece_bytes`` defaults to ``piece_size`` of each
    file's size."""
    if piece_bytes is not None and piece_bytes < 1:
        raise ValueError("piece_bytes must be at least 1")
    pieces: list[Shard] = []
    for shard in shards:
        if shard.format == "jsonl" and codec_of(shard.path) is None:
            cut = _jsonl_cuts(shard.path, piece_bytes)
        elif shard.format == "parquet":
            cut = _parquet_cuts(shard.path, piece_bytes)
        else:
            cut = []
        bounds = [(shard.start, shard.first), *cut]
        for k, (start, first) in enumerate(bounds):
            stop = bounds[k + 1][0] if k + 1 < len(bounds) else shard.stop
            piece = dataclasses.replace(shard, start=start, stop=stop, first=first)
            pieces.append(dataclasses.replace(piece, index=len(pieces)))
    return pieces


def piece_size(file_bytes: int) -> int:
    """Pieces of ``PIECE_BYTES``, or a sixteenth of a smaller file (at least a quarter of
    ``PIECE_BYTES``): a 30 MB file still makes enough pieces to keep every core busy to
    the end of a pass. A function of the file alone, never of the worker count."""
    return min(PIECE_BYTES, max(PIECE_BYTES // 4, file_bytes // 16))


def _jsonl_cuts(path: str, piece_bytes: int | None) -> list[tuple[int, int]]:
    """(byte offset, line number) of every line start where a piece begins, after the
    first: the first line start at least ``piece_bytes`` after the previous cut. One
    sequential read counting newlines (C speed: ``bytes.count`` and ``bytes.find``)."""
    cuts: list[tuple[int, int]] = []
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            piece_bytes = piece_size(size) if piece_bytes is None else piece_bytes
            if size <= piece_bytes:
                return []
            pos = newlines = 0  # bytes and newlines before ``chunk``
            target = piece_bytes  # a cut is the first line start at or after this offset
            while chunk := f.read(READ_SIZE):
                while target <= pos + len(chunk):
                    i = chunk.find(b"\n", max(target - 1 - pos, 0))
                    if i < 0:
                        break
                    cut = pos + i + 1
                    if cut >= size:
                        return cuts
                    cuts.append((cut, 1 + newlines + chunk.count(b"\n", 0, i + 1)))
                    target = cut + piece_bytes
                newlines += chunk.count(b"\n")
                pos += len(chunk)
    except (Unreadable, OSError):
        return []
    return cuts


def _parquet_cuts(path: str, piece_bytes: int | None) -> list[tuple[int, int]]:
    """(row group, row number) where each piece after the first begins: runs of row
    groups of at least ``piece_bytes`` uncompressed bytes (from the footer alone)."""
    try:
        with open_regular(path) as raw:
            meta = pq.ParquetFile(raw).metadata
    except (Unreadable, OSError, pa.ArrowException, ValueError):
        return []
    if piece_bytes is None:
        total = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        piece_bytes = piece_size(total)
    cuts: list[tuple[int, int]] = []
    rows = size = 0
    for g in range(meta.num_row_groups):
        if size >= piece_bytes:
            cuts.append((g, rows + 1))
            size = 0
        group = meta.row_group(g)
        rows += group.num_rows
        size += group.total_byte_size
    return cuts
