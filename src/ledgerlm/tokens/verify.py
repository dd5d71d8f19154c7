"""A token version checked against its manifest before anything trains on it.

``check_tokens`` is cheap (the manifest, file sizes, the index's columns) and runs
whenever a version is opened (``TokenStore``): every listed shard is present with its
token count times the dtype's size in bytes, the counts per split equal the shards'
tokens, and the index's documents and lengths equal the counts. ``verify_tokens``, run
on every reuse, adds one read of each shard: a vectorised max per chunk finds a token
id outside the vocabulary (which the model would only meet as an ``IndexError``) and,
with ``content``, the same read hashes the shard against the sha256 stored when it was
written (tokenizer.json and the index are hashed too). Any disagreement is a
``DamagedVersion`` naming the file and what differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from ledgerlm.data.passes import SPLITS
from ledgerlm.data.verify import field, hash_matches, listed_files
from ledgerlm.tokens.tokenizer import load_tokenizer
from ledgerlm.workspace import MANIFEST, BuiltVersion, DamagedVersion

TOKENIZER = "tokenizer.json"
INDEX = "index.parquet"
DTYPES = ("uint16", "uint32")
CHUNK = 1 << 23  # bytes per read of a scanned shard (a multiple of every dtype's size)


def check_tokens(folder: Path, manifest: dict[str, Any]) -> tuple[list[dict], np.dtype, int]:
    """The cheap checks (see the module); the shards' entries, their dtype, the vocab."""
    where = folder / MANIFEST
    files = listed_files(folder, manifest, "tokens")
    name = field(manifest, "dtype", str, where)
    if name not in DTYPES:
        raise DamagedVersion(where, f"dtype {name!r} is not one of {DTYPES}")
    dtype = np.dtype(name)
    tok = field(manifest, "tokenizer", dict, where)
    vocab = field(tok, "vocab_size", int, where, "tokenizer.")
    field(tok, "special", dict, where, "tokenizer.")
    for f in files:
        path = folder / f["path"]
        size, want = path.stat().st_size, f["tokens"] * dtype.itemsize
        if size != want:
            raise DamagedVersion(
                path, f"{size:,} bytes, manifest says {want:,} ({f['tokens']:,} {name} tokens)"
            )
    for extra, entry in ((TOKENIZER, tok), (INDEX, manifest.get("index"))):
        if not (path := folder / extra).is_file():
            raise DamagedVersion(path, "missing")
        said = entry.get("bytes") if isinstance(entry, dict) else None
        if isinstance(said, int) and (size := path.stat().st_size) != said:
            raise DamagedVersion(path, f"{size:,} bytes, manifest says {said:,}")
    counts = field(manifest, "counts", list, where)
    try:
        docs = _counts(where, files, counts)
    except (TypeError, KeyError, AttributeError) as err:  # a count missing or not a number
        raise DamagedVersion(where, f"counts are not numbers where expected ({err})") from None
    _index(folder / INDEX, files, docs)
    return files, dtype, vocab


def _counts(where: Path, files: list[dict], counts: list[dict]) -> dict[str, int]:
    """The tokens per split in ``counts`` equal the shards'; the documents per split."""
    docs = {}
    for split in SPLITS:
        rows = [c for c in counts if c["split"] == split]
        said = sum(c["tokens"] for c in rows)
        held = sum(f["tokens"] for f in files if f["split"] == split)
        if said != held:
            raise DamagedVersion(
                where, f"counts say {said:,} {split} tokens, its shards hold {held:,}"
            )
        docs[split] = sum(c["documents"] for c in rows)
    return docs


def _index(path: Path, files: list[dict], docs: dict[str, int]) -> None:
    """Each split's documents are the counted ones and each shard's lie inside it and
    add up to its tokens."""
    try:
        index = pq.read_table(path, columns=["split", "shard", "offset", "length"])
    except Exception as err:  # pyarrow raises several kinds for a damaged file
        raise DamagedVersion(path, f"not a readable document index ({err})") from None
    for split in SPLITS:
        n = pc.sum(pc.equal(index["split"], split)).as_py() or 0
        if n != docs[split]:
            raise DamagedVersion(path, f"{n:,} {split} documents, manifest says {docs[split]:,}")
    placed = 0
    for f in files:
        mine = index.filter(pc.equal(index["shard"], f["path"]))
        placed += mine.num_rows
        held = pc.sum(mine["length"]).as_py() or 0
        ends = pc.max(pc.add(mine["offset"], mine["length"])).as_py() or 0
        if held != f["tokens"] or ends > f["tokens"] or (pc.min(mine["offset"]).as_py() or 0) < 0:
            raise DamagedVersion(
                path,
                f"documents of {f['path']} hold {held:,} tokens up to token {ends:,}, "
                f"manifest says {f['tokens']:,}",
            )
    if placed != index.num_rows:
        raise DamagedVersion(path, f"{index.num_rows - placed:,} documents in no listed shard")


def open_tokenizer(folder: Path, vocab: int) -> Tokenizer:
    """The version's tokenizer, whose vocabulary has the manifest's size."""
    path = folder / TOKENIZER
    try:
        tok = load_tokenizer(path)
    except Exception as err:  # tokenizers raises its own Exception type
        raise DamagedVersion(path, f"not a tokenizer ({' '.join(str(err).split())})") from None
    if (size := tok.get_vocab_size()) != vocab:
        raise DamagedVersion(path, f"{size:,} tokens in its vocabulary, manifest says {vocab:,}")
    return tok


def scan_shard(path: Path, dtype: np.dtype, vocab: int, digest: str | None) -> int:
    """The largest token id of a shard, each id below ``vocab``; the sha256 equal to
    ``digest`` unless that is None."""
    h = hashlib.sha256() if digest is not None else None
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    top = seen = 0
    with open(path, "rb") as fh:
        while n := fh.readinto(buf):
            if h is not None:
                h.update(view[:n])
            ids = np.frombuffer(view[: n - n % dtype.itemsize], dtype=dtype)
            m = int(ids.max()) if ids.size else 0
            if m >= vocab:
                at = int(np.flatnonzero(ids >= vocab)[0])
                raise DamagedVersion(
                    path,
                    f"token {seen + at:,} is id {int(ids[at]):,}, outside the vocabulary "
                    f"of {vocab:,}",
                )
            top, seen = max(top, m), seen + ids.size
    if h is not None and h.hexdigest() != digest:
        raise DamagedVersion(path, "content differs from the sha256 in the manifest")
    return top


def verify_tokens(folder: Path, manifest: dict[str, Any], content: bool = True) -> dict[str, Any]:
    """Check a token version (see the module); what was checked and its seconds."""
    start = time.perf_counter()
    files, dtype, vocab = check_tokens(folder, manifest)
    where = folder / MANIFEST
    top, total = 0, 0
    for i, f in enumerate(files):
        digest = field(f, "sha256", str, where, f"files[{i}].") if content else None
        top = max(top, scan_shard(folder / f["path"], dtype, vocab, digest))
        total += (folder / f["path"]).stat().st_size
    tok = manifest["tokenizer"]
    total += hash_matches(folder / TOKENIZER, tok.get("sha256"), content)
    if isinstance(index := manifest.get("index"), dict):  # hashed since this check exists
        total += hash_matches(folder / INDEX, index.get("sha256"), content)
    return {
        "files": len(files) + 1 + isinstance(index, dict),
        "bytes": total,
        "hash": "sha256" if content else None,
        "max_token": top,
        "vocab_size": vocab,
        "seconds": round(time.perf_counter() - start, 4),
    }


def verified(built: BuiltVersion, content: bool = True) -> BuiltVersion:
    """``built`` (a reused token version) once checked, with what the check found."""
    report = verify_tokens(built.path, built.manifest, content)
    return dataclasses.replace(built, verified=report, seconds=built.seconds + report["seconds"])
