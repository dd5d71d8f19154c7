"""Raw-record readers (SPEC D1): JSONL, Parquet, folders of text files, ``builtin:stdlib``.

Inputs are expanded into shards (one file, or one group of text files, per shard) so a
process pool or Ray can read them in parallel; a shard is a small frozen value that
pickles. Reading streams one line, record batch or file at a time, never a whole corpus.

A record that cannot become a ``Document`` is not dropped: it comes out as a
``Quarantined`` value naming file, line and reason, in the position it had in the file.
So every non-blank line (or row, or text file, or piece of a text file cut by the
source's ``split``) yields exactly one output, and "records in = kept + dropped +
quarantined" can be checked downstream. A file that cannot be read at all (a broken or
looping symlink, a folder link cycle, no permission, not a Parquet file) is one
quarantined record; a Parquet file without the source's text column (``text_field``)
quarantines each of its rows; a damaged compressed stream ends in one quarantined
record that says how many compressed bytes were not read. JSONL and Parquet records
carry their text, id and domain in the fields the source names.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import glob
import hashlib
import json
import os
import posixpath
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from ledgerlm.config import BuiltinCorpusConfig, InputConfig, parse_time
from ledgerlm.data.builtin import read_builtin, stdlib_fingerprint
from ledgerlm.data.executor import PIECE_BYTES as _PIECE_BYTES
from ledgerlm.data.records import Document, ReadStats
from ledgerlm.workspace import RecordHasher

# Bump when reading rules change, so fingerprints (and caches keyed on them) expire.
READER_FORMAT = 2

BUILTIN_STDLIB = "builtin:stdlib"
TEXT_SUFFIXES = (".txt", ".md")
_JSONL_SUFFIXES = tuple(ext + comp for ext in (".jsonl", ".ndjson") for comp in ("", ".gz", ".zst"))
_GLOB_CHARS = frozenset("*?[")
_READ_SIZE = 1 << 20
_COMPRESSED_READ_SIZE = 1 << 14  # small input steps bound what one decompress call emits
_PARQUET_BATCH_ROWS = 1024
_SNIPPET_CHARS = 200
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


# --------------------------------------------------------------------------- expansion


def infer_format(name: str) -> str | None:
    """Format from the file name alone, so a shard's reader is known before it is opened."""
    lower = name.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".arrow"):
        return "arrow"
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def expand_inputs(
    inputs: list[InputConfig], base: Path, text_files_per_shard: int = 1000, dated: bool = False
) -> list[Shard]:
    """Inputs in recipe order, matches sorted, so shard indices are the same on every run.

    ``dated``: the records' dates are read strictly (``Shard.dated``)."""
    if text_files_per_shard < 1:
        raise ValueError("text_files_per_shard must be at least 1")
    shards: list[Shard] = []
    for inp in inputs:
        for shard in _expand_one(inp, Path(base), text_files_per_shard):
            shard = dataclasses.replace(shard, date_field=inp.date_field, dated=dated)
            shards.append(dataclasses.replace(shard, index=len(shards)))
    return shards


def _expand_one(inp: InputConfig, base: Path, per_shard: int) -> Iterator[Shard]:
    if inp.is_builtin():
        yield _builtin_shard(inp)
        return
    source = inp.source if inp.source is not None else inp.path
    covered: list[str] = []  # folders already read as text inputs
    loose: list[str] = []  # text files matched one by one, grouped under the input root
    root = _input_root(inp.path, base)
    for match in _matches(inp, base):
        if any(_is_within(match, folder) for folder in covered):
            continue  # `dir/**` also lists the folder's own files
        if os.path.isdir(match):
            covered.append(match)
            if arrow := hf_dataset_files(match):
                for path in arrow:
                    yield Shard(
                        0, source, "arrow", path, (), inp.domain, _rel(path, base), _fields(inp)
                    )
                continue
            yield from _folder_shards(inp, source, match, base, per_shard)
            continue
        fmt = _file_format(inp, match)
        if fmt == "text":
            loose.append(posixpath.relpath(_posix(match), _posix(root)))
            continue
        yield Shard(0, source, fmt, match, (), inp.domain, _rel(match, base), _fields(inp))
    yield from _text_shards(inp, source, root, loose, base, per_shard)


def _fields(inp: InputConfig) -> tuple[str, str, str]:
    return (inp.text_field, inp.id_field, inp.domain_field)


def hf_dataset_files(folder: str) -> list[str]:
    """The Arrow files of a Hugging Face ``datasets`` folder saved with ``save_to_disk``
    (a ``Dataset``: its ``state.json`` lists them; a ``DatasetDict``: every split in
    ``dataset_dict.json`` order), or [] when the folder is not one."""
    try:
        if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
            with open(os.path.join(folder, "dataset_dict.json"), encoding="utf-8") as f:
                splits = json.load(f)["splits"]
            return [p for split in splits for p in hf_dataset_files(os.path.join(folder, split))]
        if os.path.isfile(os.path.join(folder, "state.json")):
            with open(os.path.join(folder, "state.json"), encoding="utf-8") as f:
                files = [d["filename"] for d in json.load(f)["_data_files"]]
            return [os.path.join(folder, name) for name in files]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ReaderError(f"'{folder}': not a readable datasets folder: {err}") from None
    return []


def _builtin_shard(inp: InputConfig) -> Shard:
    if not inp.path.startswith("builtin:"):
        raise ReaderError(f"input '{inp.path}': format 'builtin' needs '{BUILTIN_STDLIB}'")
    if inp.path != BUILTIN_STDLIB:
        name = inp.path.removeprefix("builtin:")
        raise ReaderError(f"input '{inp.path}': unknown built-in corpus '{name}' (known: stdlib)")
    if inp.format not in ("auto", "builtin"):
        raise ReaderError(f"input '{inp.path}': a built-in corpus cannot be read as {inp.format}")
    return Shard(0, BUILTIN_STDLIB, "builtin", BUILTIN_STDLIB, (), inp.domain)


def _has_glob(path: str) -> bool:
    return any(ch in _GLOB_CHARS for ch in path)


def _absolute(path: str, base: Path) -> str:
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(base, path))


def _matches(inp: InputConfig, base: Path) -> list[str]:
    """Absolute paths, sorted by their text so that order never depends on the filesystem."""
    if not _has_glob(inp.path):
        full = _absolute(inp.path, base)
        if not os.path.exists(full):
            why = _unreadable_cause(full) if os.path.islink(full) else "no such file or folder"
            raise ReaderError(f"input '{inp.path}': {why}")
        return [full]
    found = glob.glob(inp.path, root_dir=base, recursive=True)
    if not found:
        raise ReaderError(f"input '{inp.path}': matches no file")
    return [_absolute(p, base) for p in sorted(found)]


def _input_root(path: str, base: Path) -> str:
    """The folder that ids of loose text files are relative to: the pattern's fixed prefix."""
    parts = Path(path).parts
    fixed = []
    for part in parts:
        if _has_glob(part):
            break
        fixed.append(part)
    if len(fixed) == len(parts):  # a plain path: its folder, or itself if it is one
        full = _absolute(path, base)
        return full if os.path.isdir(full) else os.path.dirname(full)
    return _absolute(os.path.join(*fixed) if fixed else ".", base)


def _is_within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)


def _posix(path: str) -> str:
    return Path(path).as_posix()


def _rel(path: str, base: Path) -> str:
    try:
        return Path(path).relative_to(os.path.abspath(base)).as_posix()
    except ValueError:
        return ""


def _file_format(inp: InputConfig, path: str) -> str:
    fmt = inp.format if inp.format != "auto" else infer_format(os.path.basename(path))
    if fmt is None:
        name = os.path.basename(path)
        raise ReaderError(
            f"input '{inp.path}': unknown extension of '{name}' "
            "(expected .jsonl[.gz|.zst], .ndjson[.gz|.zst], .parquet, .txt, .md)"
        )
    return fmt


def _folder_shards(
    inp: InputConfig, source: str, folder: str, base: Path, per_shard: int
) -> Iterator[Shard]:
    if inp.format not in ("auto", "text"):
        raise ReaderError(f"input '{inp.path}': '{folder}' is a folder, not a {inp.format} file")
    try:
        files = _text_files(folder)
    except OSError as err:
        raise ReaderError(
            f"input '{inp.path}': folder '{folder}' cannot be listed: {err.strerror or err}"
        ) from None
    if not files:
        raise ReaderError(f"input '{inp.path}': folder '{folder}' has no .txt or .md file")
    yield from _text_shards(inp, source, folder, files, base, per_shard)


def _text_files(folder: str) -> list[str]:
    """Relative POSIX paths of the text files under ``folder``, sorted.

    Folder links are followed, except one back to a folder above it (a cycle): that
    link is listed as a path of its own, like a broken link (looping or dangling,
    whatever its name) and a subfolder that cannot be listed. Reading such a path
    quarantines it with its cause, so nothing under the folder disappears silently and
    no walk goes round forever. Raises ``OSError`` if ``folder`` itself cannot be listed.
    """
    found: list[str] = []
    top = os.stat(folder)
    stack = [(folder, "", frozenset({(top.st_dev, top.st_ino)}))]
    while stack:
        path, rel, above = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            if not rel:
                raise
            found.append(rel)
            continue
        for entry in entries:
            sub = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir()  # follows a link
                key = None
                if is_dir:
                    st = entry.stat()
                    key = (st.st_dev, st.st_ino)
                elif entry.is_symlink():
                    os.stat(entry.path)  # raises for a looping or dangling link
            except OSError:
                found.append(sub)
                continue
            if key is not None:
                if key in above:
                    found.append(sub)  # a link back to a folder above: a cycle
                else:
                    stack.append((entry.path, sub, above | {key}))
            elif entry.name.lower().endswith(TEXT_SUFFIXES):
                found.append(sub)
    return sorted(found)


def _text_shards(
    inp: InputConfig,
    source: str,
    folder: str,
    files: list[str],
    base: Path,
    per_shard: int,
) -> Iterator[Shard]:
    rel = _rel(folder, base)
    for start in range(0, len(files), per_shard):
        chunk = tuple(files[start : start + per_shard])
        yield Shard(
            0, source, "text", folder, chunk, inp.domain, rel, _fields(inp), inp.split_rule()
        )


# --------------------------------------------------------------------------- pieces

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
        if shard.format == "jsonl" and _codec(shard.path) is None:
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
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            piece_bytes = piece_size(size) if piece_bytes is None else piece_bytes
            if size <= piece_bytes:
                return []
            pos = newlines = 0  # bytes and newlines before ``chunk``
            target = piece_bytes  # a cut is the first line start at or after this offset
            while chunk := f.read(_READ_SIZE):
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
    except (_Unreadable, OSError):
        return []
    return cuts


def _parquet_cuts(path: str, piece_bytes: int | None) -> list[tuple[int, int]]:
    """(row group, row number) where each piece after the first begins: runs of row
    groups of at least ``piece_bytes`` uncompressed bytes (from the footer alone)."""
    try:
        with _open_regular(path) as raw:
            meta = pq.ParquetFile(raw).metadata
    except (_Unreadable, OSError, pa.ArrowException, ValueError):
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


# --------------------------------------------------------------------------- reading


def _read_builtin(builtin: BuiltinCorpusConfig) -> Iterator[Document | Quarantined]:
    """Built-in documents, then one quarantine entry per stdlib file that is not UTF-8."""
    stats = ReadStats()
    yield from read_builtin(builtin, stats)
    for rel in stats.skipped_not_utf8:
        yield Quarantined(f"{BUILTIN_STDLIB}/{rel}", None, "invalid_utf8", "")


def read_shard(shard: Shard, builtin: BuiltinCorpusConfig) -> Iterator[Document | Quarantined]:
    """One output per record, in file order, so callers can count and resume by position."""
    if shard.format == "jsonl":
        return _read_jsonl(shard)
    if shard.format == "parquet":
        return _read_parquet(shard)
    if shard.format == "arrow":
        return _read_arrow(shard)
    if shard.format == "text":
        return _read_text(shard)
    if shard.format == "builtin":
        return _read_builtin(builtin)
    raise ReaderError(f"input '{shard.source}': unknown format '{shard.format}'")


def _label(shard: Shard) -> str:
    return shard.rel or shard.path


class _Unreadable(Exception):
    """A file that cannot be read at all; the message is the cause."""


def _unreadable_cause(path: str, err: OSError | None = None) -> str:
    """Why ``path`` cannot be read, naming the target of a broken link."""
    if os.path.islink(path):
        target = os.readlink(path)
        try:
            os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"symlink loop (-> {target})"
            if e.errno == errno.ENOENT:
                return f"dangling symlink (-> {target})"
            return f"symlink (-> {target}): {e.strerror or e}"
        if os.path.isdir(path):
            return f"symlink cycle: folder link (-> {target}) back to a folder above it"
    if os.path.isdir(path):
        try:
            os.listdir(path)
        except OSError as e:
            return f"folder cannot be listed: {e.strerror or e}"
        return "is a folder"
    if err is not None:
        return err.strerror or str(err)
    return "not a regular file"


def _open_regular(path: str) -> BinaryIO:
    """Open a regular file for reading; a FIFO or device would block or never end."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable(_unreadable_cause(path))
        return open(path, "rb")
    except OSError as err:
        raise _Unreadable(_unreadable_cause(path, err)) from None


def _unreadable(shard: Shard, line: int | None, err: _Unreadable | OSError) -> Quarantined:
    cause = str(err) if isinstance(err, _Unreadable) else _unreadable_cause(shard.path, err)
    return Quarantined(_label(shard), line, "unreadable", cause[:_SNIPPET_CHARS])


def _id_prefix(shard: Shard) -> str:
    return f"{shard.source}:{shard.rel or os.path.basename(shard.path)}"


def _snippet(raw: bytes) -> str:
    return raw[: _SNIPPET_CHARS * 5].decode("utf-8", errors="replace")[:_SNIPPET_CHARS]


class _CorruptStream(Exception):
    """The compressed bytes end early or are damaged; what came before is still good."""


def _plain_chunks(raw: BinaryIO) -> Iterator[bytes]:
    while chunk := raw.read(_READ_SIZE):
        yield chunk


class _Members:
    """Decompress member after member (gzip) or frame after frame (zstd), as fed.

    Driving the decoders by hand, rather than through ``gzip.GzipFile`` or zstandard's
    stream reader, keeps every byte decoded before damage (GzipFile drops its partial
    read) and notices a stream that ends inside a frame (zstandard's reader does not).
    """

    def __init__(self, codec: str) -> None:
        self.codec = codec
        if codec == "gzip":
            self._new: Callable[[], Any] = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._new = zstandard.ZstdDecompressor().decompressobj
        self._decoder, self._fed = self._new(), False

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while data:
                if not self._fed and self.codec == "gzip":  # zero bytes between members
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                out = self._decoder.decompress(data)
                self._fed = True
                if out:
                    yield out
                if not self._decoder.eof:
                    break
                data = self._decoder.unused_data
                self._decoder, self._fed = self._new(), False
        except (zlib.error, zstandard.ZstdError) as err:
            raise _CorruptStream(f"{self.codec}: {err}") from err

    def finish(self) -> None:
        if self._fed:
            raise _CorruptStream(f"{self.codec}: compressed stream ends inside a frame")


def _codec(path: str) -> str | None:
    lower = path.lower()
    if lower.endswith(".gz"):
        return "gzip"
    if lower.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def _member_chunks(raw: BinaryIO, codec: str) -> Iterator[bytes]:
    members = _Members(codec)
    while data := raw.read(_COMPRESSED_READ_SIZE):  # small steps bound each output
        yield from members.feed(data)
    members.finish()


def _decoded_chunks(raw: BinaryIO, path: str) -> Iterator[bytes]:
    codec = _codec(path)
    if codec is None:
        yield from _plain_chunks(raw)
    else:
        yield from _member_chunks(raw, codec)


def compressed_prefix(path: str, decoded: int) -> int:
    """The fewest leading bytes of a compressed file that decode to ``decoded`` bytes.

    After damage, the file size less this (for ``decoded`` = the bytes of the complete
    lines read) is what the reader did not use. One pass finds the step in which the
    output reaches ``decoded``; a second feeds that step byte by byte.
    """
    codec = _codec(path)
    if codec is None:
        return decoded  # not compressed: a byte is a byte
    if decoded <= 0:
        return 0
    with open(path, "rb") as raw:
        steps, total = 0, 0
        members = _Members(codec)
        try:
            while total < decoded and (data := raw.read(_COMPRESSED_READ_SIZE)):
                steps += 1
                for out in members.feed(data):
                    total += len(out)
        except _CorruptStream:
            pass
        if total < decoded:  # cannot happen for what a reader decoded: all of it is used
            return raw.tell()
        raw.seek(0)
        members, total = _Members(codec), 0
        for _ in range(steps - 1):
            for out in members.feed(raw.read(_COMPRESSED_READ_SIZE)):
                total += len(out)
        offset = raw.tell()
        for byte in raw.read(_COMPRESSED_READ_SIZE):
            if total >= decoded:
                break
            for out in members.feed(bytes((byte,))):
                total += len(out)
            offset += 1
        return offset


def _split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Lines without their newline; a partial line cut off by corruption is never yielded."""
    pending: list[bytes] = []
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending.append(chunk[start:end])
            yield b"".join(pending)
            pending.clear()
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


def _range_chunks(raw: BinaryIO, start: int, stop: int | None) -> Iterator[bytes]:
    """The bytes [start, stop) of a plain file (to its end when ``stop`` is None)."""
    if start:
        raw.seek(start)
    left = None if stop is None else stop - start
    while left is None or left > 0:
        chunk = raw.read(_READ_SIZE if left is None else min(_READ_SIZE, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def _read_jsonl(shard: Shard) -> Iterator[Document | Quarantined]:
    lineno = shard.first - 1
    used = 0  # decoded bytes of the complete lines read
    try:
        with _open_regular(shard.path) as f:
            if shard.start or shard.stop is not None:  # a piece of a plain file
                chunks = _range_chunks(f, shard.start, shard.stop)
            else:
                chunks = _decoded_chunks(f, shard.path)
            record = _jsonl_record
            for lineno, raw in enumerate(_split_lines(chunks), start=shard.first):
                used += len(raw) + 1
                if raw.strip():
                    yield record(shard, lineno, raw)
    except _CorruptStream as err:
        size = os.path.getsize(shard.path)
        unread = size - compressed_prefix(shard.path, used)
        detail = f"{unread} of {size} compressed bytes not read; {err}"
        yield Quarantined(
            _label(shard), lineno + 1, "corrupt_stream", detail[:_SNIPPET_CHARS], unread
        )
    except (_Unreadable, OSError) as err:
        yield _unreadable(shard, lineno + 1 if lineno else None, err)


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
        result = _to_document(record, shard, f"{_id_prefix(shard)}:{lineno}")
        if isinstance(result, str):
            return Quarantined(_label(shard), lineno, result, _snippet(raw))
        return result
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Quarantined(_label(shard), lineno, "invalid_utf8", _snippet(raw))
    try:
        record = json.loads(line.removeprefix("\ufeff") if lineno == 1 else line)
    except (ValueError, RecursionError):
        return Quarantined(_label(shard), lineno, "bad_json", _snippet(raw))
    if not isinstance(record, dict):
        return Quarantined(_label(shard), lineno, "not_an_object", _snippet(raw))
    result = _to_document(record, shard, f"{_id_prefix(shard)}:{lineno}")
    if isinstance(result, str):
        return Quarantined(_label(shard), lineno, result, _snippet(raw))
    return result


class _BadField(Exception):
    pass


def _text_of(record: dict[str, Any], field: str = "text") -> str:
    """The text, or raises with the reason it is unusable."""
    text = record.get(field)
    if text is None:
        raise _BadField("missing_text")
    if not isinstance(text, str):
        raise _BadField("text_not_string")
    if not text.strip():
        raise _BadField("empty_text")
    return text


def _name_field(value: Any) -> str | None:
    """id, source and domain group and join documents, so they must be non-empty strings."""
    if value is None:
        return None
    if isinstance(value, str) and value:
        return value
    raise _BadField("bad_field")


def _id_field(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _name_field(value)


def _plain_field(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise _BadField("bad_field")


def _date_field(value: Any) -> str | None:
    """Parquet stores dates natively; their ISO form is what a JSONL record would carry."""
    if isinstance(value, dt.date):
        return value.isoformat()
    return _plain_field(value)


def _strict_date(value: Any) -> str | None:
    """A date that ``parse_time`` reads (ISO text as given; a Unix time as its ISO text
    in UTC), None for none (missing, null or empty), or raises ``bad_date``."""
    if value is None or value == "":
        return None
    try:
        micros = parse_time(value)
    except ValueError:
        raise _BadField("bad_date") from None
    if isinstance(value, int | float):
        return (
            dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
        ).isoformat()
    return value.isoformat() if isinstance(value, dt.date) else value


def _meta(
    record: dict[str, Any], fields: tuple[str, ...] = (*DEFAULT_FIELDS, "date")
) -> str | None:
    """The record's other fields: all but the ones read (the mapped text, id, domain and
    date, and source, lang), so a ``text`` field not chosen as the text is kept."""
    read = {*fields, "source", "lang"}
    rest = {k: v for k, v in record.items() if k not in read}
    if not rest:
        return None
    return json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _encodable(*values: str | None) -> bool:
    """JSON escapes can smuggle lone surrogates in, which no UTF-8 writer accepts later."""
    try:
        for value in values:
            if value is not None and not value.isascii():
                value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _to_document(record: dict[str, Any], shard: Shard, default_id: str) -> Document | str:
    """A document, or the reason (a string) the record cannot be one."""
    text_field, id_field, domain_field = shard.fields
    try:
        text = _text_of(record, text_field)
        doc = Document(
            id=_id_field(record.get(id_field)) or default_id,
            text=text,
            source=_name_field(record.get("source")) or shard.source,
            domain=_name_field(record.get(domain_field)) or shard.domain or "default",
            lang=_plain_field(record.get("lang")),
            date=(_strict_date if shard.dated else _date_field)(record.get(shard.date_field)),
            meta=_meta(record, (*shard.fields, shard.date_field)),
        )
    except _BadField as err:
        return str(err)
    if not _encodable(doc.id, doc.text, doc.source, doc.domain, doc.lang, doc.date, doc.meta):
        return "invalid_utf8"
    return doc


def _read_parquet(shard: Shard) -> Iterator[Document | Quarantined]:
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


def _read_arrow(shard: Shard) -> Iterator[Document | Quarantined]:
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
        raw = _open_regular(shard.path)
    except _Unreadable as err:
        yield _unreadable(shard, None, err)
        return
    with raw:
        try:
            schema, batches = batches_of(raw)
        except (pa.ArrowException, OSError, ValueError) as err:
            detail = f"not a readable {kind} file: {err}"[:_SNIPPET_CHARS]
            yield Quarantined(_label(shard), None, "corrupt_stream", detail)
            return
        has_text = shard.fields[0] in schema.names
        try:
            for batch in batches:
                for record in batch.to_pylist():
                    row += 1
                    yield _parquet_record(shard, row, record, has_text)
        except (pa.ArrowException, OSError, ValueError) as err:
            yield Quarantined(_label(shard), row + 1, "corrupt_stream", str(err)[:_SNIPPET_CHARS])


def _parquet_record(
    shard: Shard, row: int, record: dict[str, Any], has_text: bool = True
) -> Document | Quarantined:
    if has_text:
        result = _to_document(record, shard, f"{_id_prefix(shard)}:{row}")
    else:
        result = "no_text_column"
    if isinstance(result, str):
        shown = json.dumps(record, ensure_ascii=False, default=str)[:_SNIPPET_CHARS]
        return Quarantined(_label(shard), row, result, shown)
    return result


def text_pieces(text: str, rule: str) -> Iterator[str]:
    """A text file's documents under a split rule: the whole file; paragraphs between
    blank lines; lines; or pieces of about N characters cut at a line end (``chunk:N``;
    a line longer than N is cut inside). Blank pieces are left out."""
    if rule == "file":
        pieces: Iterable[str] = [text]
    elif rule == "blank_lines":
        pieces = re.split(r"\n(?:[ \t\r\f\v]*\n)+", text)
    elif rule == "lines":
        pieces = text.splitlines()
    else:
        pieces = _chunks(text, int(rule.removeprefix("chunk:")))
    for piece in pieces:
        if piece.strip():
            yield piece


def _chunks(text: str, size: int) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut >= start else end
        yield text[start:end]
        start = end


def _arrow_batches(raw: BinaryIO) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and record batches of an Arrow IPC stream, or else of an IPC file."""
    try:
        stream = pa.ipc.open_stream(raw)
        return stream.schema, iter(stream)
    except pa.ArrowInvalid:
        raw.seek(0)
        file = pa.ipc.open_file(raw)
        return file.schema, (file.get_batch(i) for i in range(file.num_record_batches))


def _read_text(shard: Shard) -> Iterator[Document | Quarantined]:
    for rel in shard.files:
        label = posixpath.normpath(f"{_label(shard)}/{rel}")
        try:
            with _open_regular(os.path.join(shard.path, rel)) as f:
                data = f.read()
        except (_Unreadable, OSError) as err:
            cause = str(err) if isinstance(err, _Unreadable) else (err.strerror or str(err))
            yield Quarantined(label, None, "unreadable", cause[:_SNIPPET_CHARS])
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            yield Quarantined(label, None, "invalid_utf8", _snippet(data))
            continue
        if not text.strip():
            yield Quarantined(label, None, "empty_text", _snippet(data))
            continue
        if shard.split == "file":
            yield Document(rel, text, shard.source, shard.domain or "default")
            continue
        for k, piece in enumerate(text_pieces(text, shard.split), start=1):
            yield Document(f"{rel}#{k}", piece, shard.source, shard.domain or "default")


# --------------------------------------------------------------------------- fingerprint


def _file_digest(path: str) -> str:
    """The bytes' sha256; for a path that cannot be read, a hash of why (which is what
    reading it yields: one quarantined record saying so)."""
    h = hashlib.sha256()
    try:
        with _open_regular(path) as f:
            while chunk := f.read(_READ_SIZE):
                h.update(chunk)
    except (_Unreadable, OSError) as err:
        cause = str(err) if isinstance(err, _Unreadable) else (err.strerror or str(err))
        return hashlib.sha256(f"unreadable:{cause}".encode()).hexdigest()
    return h.hexdigest()


def _shard_files(shard: Shard) -> Iterator[tuple[str, str]]:
    """(name, path) pairs; names are relative so a moved project keeps its fingerprints."""
    if shard.format == "text":
        for rel in shard.files:
            yield rel, os.path.join(shard.path, rel)
    else:
        yield shard.rel or os.path.basename(shard.path), shard.path


def shard_fingerprint(shard: Shard, builtin: BuiltinCorpusConfig) -> str:
    """Identifies what ``read_shard`` would yield, to decide whether cached output is reusable.

    Besides the bytes it covers the settings that change the documents (format, source,
    default domain) but not ``index``, so adding an input does not expire other shards.
    """
    if shard.format == "builtin":
        return stdlib_fingerprint(builtin)
    h = RecordHasher()
    put = h.put
    domain = shard.domain if shard.domain is not None else "\0none"
    put("ledgerlm.readers", str(READER_FORMAT), shard.format, shard.source, domain)
    if shard.fields != DEFAULT_FIELDS or shard.split != "file":  # defaults keep old prints
        put("fields", *shard.fields, "split", shard.split)
    if shard.date_field != "date" or shard.dated:
        put("date", shard.date_field, "strict" if shard.dated else "as given")
    for name, path in _shard_files(shard):
        put(name, _file_digest(path))
    return h.hexdigest()
