"""Raw-record readers (SPEC D1): JSONL, Parquet, folders of text files, ``builtin:stdlib``.

Inputs are expanded into shards (one file, or one group of text files, per shard) so a
process pool or Ray can read them in parallel; a shard is a small frozen value that
pickles. Reading streams one line, record batch or file at a time, never a whole corpus.

A record that cannot become a ``Document`` is not dropped: it comes out as a
``Quarantined`` value naming file, line and reason, in the position it had in the file.
So every non-blank line (or row, or text file) yields exactly one output, and
"records in = kept + dropped + quarantined" can be checked downstream.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import glob
import hashlib
import json
import os
import posixpath
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from ledgerlm.config import BuiltinCorpusConfig, InputConfig
from ledgerlm.data.builtin import read_builtin, stdlib_fingerprint
from ledgerlm.data.records import Document, ReadStats
from ledgerlm.workspace import RecordHasher

# Bump when reading rules change, so fingerprints (and caches keyed on them) expire.
READER_FORMAT = 1

BUILTIN_STDLIB = "builtin:stdlib"
TEXT_SUFFIXES = (".txt", ".md")
_JSONL_SUFFIXES = tuple(ext + comp for ext in (".jsonl", ".ndjson") for comp in ("", ".gz", ".zst"))
_GLOB_CHARS = frozenset("*?[")
_READ_SIZE = 1 << 20
_COMPRESSED_READ_SIZE = 1 << 14  # small input steps bound what one decompress call emits
_PARQUET_BATCH_ROWS = 1024
_SNIPPET_CHARS = 200
_KNOWN_FIELDS = ("id", "text", "source", "domain", "lang", "date")


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


@dataclass(frozen=True)
class Quarantined:
    """A record that could not become a document, kept so that nothing is lost silently."""

    file: str
    line: int | None
    reason: str
    snippet: str


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
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(TEXT_SUFFIXES):
        return "text"
    return None


def expand_inputs(
    inputs: list[InputConfig], base: Path, text_files_per_shard: int = 1000
) -> list[Shard]:
    """Inputs in recipe order, matches sorted, so shard indices are the same on every run."""
    if text_files_per_shard < 1:
        raise ValueError("text_files_per_shard must be at least 1")
    shards: list[Shard] = []
    for inp in inputs:
        for shard in _expand_one(inp, Path(base), text_files_per_shard):
            shards.append(dataclasses.replace(shard, index=len(shards)))
    return shards


def _expand_one(inp: InputConfig, base: Path, per_shard: int) -> Iterator[Shard]:
    if inp.format == "builtin" or inp.path.startswith("builtin:"):
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
            yield from _folder_shards(inp, source, match, base, per_shard)
            continue
        fmt = _file_format(inp, match)
        if fmt == "text":
            loose.append(posixpath.relpath(_posix(match), _posix(root)))
            continue
        yield Shard(0, source, fmt, match, (), inp.domain, _rel(match, base))
    yield from _text_shards(source, root, loose, inp.domain, base, per_shard)


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
            raise ReaderError(f"input '{inp.path}': no such file or folder")
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
    files = _text_files(folder)
    if not files:
        raise ReaderError(f"input '{inp.path}': folder '{folder}' has no .txt or .md file")
    yield from _text_shards(source, folder, files, inp.domain, base, per_shard)


def _text_files(folder: str) -> list[str]:
    """Relative POSIX paths in sorted order; symlinked folders are not followed (no loops)."""
    found: list[str] = []
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            if name.lower().endswith(TEXT_SUFFIXES):
                found.append(_posix(os.path.relpath(os.path.join(dirpath, name), folder)))
    return sorted(found)


def _text_shards(
    source: str,
    folder: str,
    files: list[str],
    domain: str | None,
    base: Path,
    per_shard: int,
) -> Iterator[Shard]:
    rel = _rel(folder, base)
    for start in range(0, len(files), per_shard):
        chunk = tuple(files[start : start + per_shard])
        yield Shard(0, source, "text", folder, chunk, domain, rel)


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
    if shard.format == "text":
        return _read_text(shard)
    if shard.format == "builtin":
        return _read_builtin(builtin)
    raise ReaderError(f"input '{shard.source}': unknown format '{shard.format}'")


def _label(shard: Shard) -> str:
    return shard.rel or shard.path


def _id_prefix(shard: Shard) -> str:
    return f"{shard.source}:{shard.rel or os.path.basename(shard.path)}"


def _snippet(raw: bytes) -> str:
    return raw[: _SNIPPET_CHARS * 5].decode("utf-8", errors="replace")[:_SNIPPET_CHARS]


class _CorruptStream(Exception):
    """The compressed bytes end early or are damaged; what came before is still good."""


def _plain_chunks(raw: BinaryIO) -> Iterator[bytes]:
    while chunk := raw.read(_READ_SIZE):
        yield chunk


def _member_chunks(
    raw: BinaryIO, new_decoder: Callable[[], Any], zero_padding: bool
) -> Iterator[bytes]:
    """Decompress member after member (gzip) or frame after frame (zstd) in small steps.

    Driving the decoders by hand, rather than through ``gzip.GzipFile`` or zstandard's
    stream reader, keeps every byte decoded before damage (GzipFile drops its partial
    read) and notices a stream that ends inside a frame (zstandard's reader does not).
    """
    decoder, fed = new_decoder(), False
    while data := raw.read(_COMPRESSED_READ_SIZE):
        while data:
            if not fed and zero_padding:  # gzip tolerates zero bytes between members
                data = data.lstrip(b"\0")
                if not data:
                    break
            out = decoder.decompress(data)
            fed = True
            if out:
                yield out
            if not decoder.eof:
                break
            data = decoder.unused_data
            decoder, fed = new_decoder(), False
    if fed:
        raise _CorruptStream("compressed stream ends inside a frame")


def _gzip_chunks(raw: BinaryIO) -> Iterator[bytes]:
    try:
        yield from _member_chunks(raw, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), True)
    except zlib.error as err:
        raise _CorruptStream(f"gzip: {err}") from err


def _zstd_chunks(raw: BinaryIO) -> Iterator[bytes]:
    dctx = zstandard.ZstdDecompressor()
    try:
        yield from _member_chunks(raw, dctx.decompressobj, False)
    except zstandard.ZstdError as err:
        raise _CorruptStream(f"zstd: {err}") from err


def _decoded_chunks(path: str) -> Iterator[bytes]:
    lower = path.lower()
    with open(path, "rb") as raw:
        if lower.endswith(".gz"):
            yield from _gzip_chunks(raw)
        elif lower.endswith((".zst", ".zstd")):
            yield from _zstd_chunks(raw)
        else:
            yield from _plain_chunks(raw)


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


def _read_jsonl(shard: Shard) -> Iterator[Document | Quarantined]:
    lineno = 0
    try:
        for lineno, raw in enumerate(_split_lines(_decoded_chunks(shard.path)), start=1):
            if raw.strip():
                yield _jsonl_record(shard, lineno, raw)
    except _CorruptStream as err:
        yield Quarantined(_label(shard), lineno + 1, "corrupt_stream", str(err)[:_SNIPPET_CHARS])


def _jsonl_record(shard: Shard, lineno: int, raw: bytes) -> Document | Quarantined:
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


def _text_of(record: dict[str, Any]) -> str:
    """The text, or raises with the reason it is unusable."""
    text = record.get("text")
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


def _meta(record: dict[str, Any]) -> str | None:
    rest = {k: v for k, v in record.items() if k not in _KNOWN_FIELDS}
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
    try:
        text = _text_of(record)
        doc = Document(
            id=_id_field(record.get("id")) or default_id,
            text=text,
            source=_name_field(record.get("source")) or shard.source,
            domain=_name_field(record.get("domain")) or shard.domain or "default",
            lang=_plain_field(record.get("lang")),
            date=_date_field(record.get("date")),
            meta=_meta(record),
        )
    except _BadField as err:
        return str(err)
    if not _encodable(doc.id, doc.text, doc.source, doc.domain, doc.lang, doc.date, doc.meta):
        return "invalid_utf8"
    return doc


def _open_parquet(shard: Shard, raw: BinaryIO) -> pq.ParquetFile:
    try:
        pf = pq.ParquetFile(raw)
    except (pa.ArrowException, OSError) as err:
        raise ReaderError(
            f"input '{shard.source}': '{shard.path}' is not a readable Parquet file: {err}"
        ) from None
    if "text" not in pf.schema_arrow.names:
        raise ReaderError(f"input '{shard.source}': '{shard.path}' has no 'text' column")
    return pf


def _read_parquet(shard: Shard) -> Iterator[Document | Quarantined]:
    row = 0
    with open(shard.path, "rb") as raw:
        pf = _open_parquet(shard, raw)
        try:
            for batch in pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
                for record in batch.to_pylist():
                    row += 1
                    yield _parquet_record(shard, row, record)
        except (pa.ArrowException, OSError) as err:
            yield Quarantined(_label(shard), row + 1, "corrupt_stream", str(err)[:_SNIPPET_CHARS])


def _parquet_record(shard: Shard, row: int, record: dict[str, Any]) -> Document | Quarantined:
    result = _to_document(record, shard, f"{_id_prefix(shard)}:{row}")
    if isinstance(result, str):
        shown = json.dumps(record, ensure_ascii=False, default=str)[:_SNIPPET_CHARS]
        return Quarantined(_label(shard), row, result, shown)
    return result


def _read_text(shard: Shard) -> Iterator[Document | Quarantined]:
    for rel in shard.files:
        data = Path(shard.path, rel).read_bytes()
        label = posixpath.normpath(f"{_label(shard)}/{rel}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            yield Quarantined(label, None, "invalid_utf8", _snippet(data))
            continue
        if not text.strip():
            yield Quarantined(label, None, "empty_text", _snippet(data))
            continue
        yield Document(rel, text, shard.source, shard.domain or "default")


# --------------------------------------------------------------------------- fingerprint


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_SIZE):
            h.update(chunk)
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
    for name, path in _shard_files(shard):
        put(name, _file_digest(path))
    return h.hexdigest()
