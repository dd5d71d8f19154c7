"""The data stage: read -> exact dedup -> split by document -> Parquet shards + manifest.

Streaming: documents flow one at a time and shards are written as they fill, so
memory holds one shard plus the dedup digests, whatever the corpus size.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.config import DataConfig
from ledgerlm.data.builtin import read_builtin, stdlib_fingerprint
from ledgerlm.data.dedup import ExactDedup
from ledgerlm.data.records import DOCUMENT_SCHEMA, Document, ReadStats, documents_to_table
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.workspace import (
    MANIFEST,
    SCHEMA_VERSION,
    BuiltVersion,
    Workspace,
    atomic_write_json,
    content_hash,
    file_sha256,
)

SPLITS = ("train", "val")
BUILTIN = "builtin:stdlib"


class DataError(ValueError):
    """Bad data-stage input; the message names the source and the reason."""


def split_of(doc_id: str, val_fraction: float, seed: int) -> str:
    """A document's split depends only on its id, so it is stable as the corpus grows."""
    h = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(h, "big") / 2**64 < val_fraction else "train"


def _fingerprint(cfg: DataConfig, source: str) -> str:
    if source == BUILTIN:
        return stdlib_fingerprint(cfg.builtin)
    raise DataError(f"source {source!r}: unsupported (this version reads {BUILTIN!r})")


def _read(cfg: DataConfig, source: str, stats: ReadStats) -> Iterator[Document]:
    if source == BUILTIN:
        return read_builtin(cfg.builtin, stats)
    raise DataError(f"source {source!r}: unsupported")


def data_version(cfg: DataConfig) -> tuple[str, list[dict[str, str]]]:
    """The version id names the inputs' content hashes and every parameter."""
    inputs = [{"source": s, "fingerprint": _fingerprint(cfg, s)} for s in cfg.sources]
    return content_hash("data", SCHEMA_VERSION, inputs, cfg.model_dump(mode="json")), inputs


class _ShardWriter:
    """Writes one split's documents into numbered Parquet shards as they fill."""

    def __init__(self, folder: Path, split: str, shard_docs: int) -> None:
        self.folder, self.split, self.shard_docs = folder, split, shard_docs
        self.buffer: list[Document] = []
        self.files: list[dict[str, Any]] = []

    def add(self, doc: Document) -> None:
        self.buffer.append(doc)
        if len(self.buffer) >= self.shard_docs:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        name = f"{self.split}-{len(self.files):05d}.parquet"
        path = self.folder / name
        pq.write_table(documents_to_table(self.buffer), path, compression="zstd")
        self.files.append(
            {
                "path": name,
                "split": self.split,
                "rows": len(self.buffer),
                "chars": sum(len(d.text) for d in self.buffer),
                "sha256": file_sha256(path),
            }
        )
        self.buffer = []


def prepare_data(
    cfg: DataConfig, workspace: Workspace, progress: Progress | None = None
) -> BuiltVersion:
    """Build (or reuse) the data version for ``cfg``; nothing half-written is ever visible."""
    progress = progress or NullProgress()
    start = time.perf_counter()
    version, inputs = data_version(cfg)
    if reused := workspace.reuse("data", version, start):
        return reused

    dedup = ExactDedup()
    records_in = 0
    dropped: Counter[tuple[str, str]] = Counter()
    drops: list[dict[str, str]] = []
    kept_docs: Counter[tuple[str, str]] = Counter()
    kept_chars: Counter[tuple[str, str]] = Counter()
    read_stats: dict[str, dict[str, Any]] = {}

    with workspace.building("data", version) as tmp:
        writers = {s: _ShardWriter(tmp, s, cfg.shard_docs) for s in SPLITS}
        with progress.task("data: read, dedup, split") as task:
            for source in cfg.sources:
                stats = ReadStats()
                for doc in _read(cfg, source, stats):
                    records_in += 1
                    task.advance(1)
                    kept_id = dedup.check(doc.id, doc.text)
                    if kept_id is not None:
                        dropped[(dedup.name, "duplicate")] += 1
                        drops.append(
                            {
                                "id": doc.id,
                                "step": dedup.name,
                                "reason": "duplicate",
                                "kept": kept_id,
                            }
                        )
                        continue
                    split = split_of(doc.id, cfg.val_fraction, cfg.split_seed)
                    writers[split].add(doc)
                    kept_docs[(split, doc.domain)] += 1
                    kept_chars[(split, doc.domain)] += len(doc.text)
                read_stats[source] = stats.to_dict()
        for w in writers.values():
            w.flush()
        drop_schema = pa.schema([(k, pa.string()) for k in ("id", "step", "reason", "kept")])
        pq.write_table(pa.Table.from_pylist(drops, schema=drop_schema), tmp / "drops.parquet")

        kept = sum(kept_docs.values())
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "kind": "data",
            "version": version,
            "inputs": [{**i, "read": read_stats[i["source"]]} for i in inputs],
            "document_schema": [f.name for f in DOCUMENT_SCHEMA],
            "steps": [{"name": dedup.name, "params": dedup.params()}],
            "split": {
                "method": "per-document hash of id",
                "val_fraction": cfg.val_fraction,
                "seed": cfg.split_seed,
            },
            "config": cfg.model_dump(mode="json"),
            "counts": {
                "records_in": records_in,
                "kept": kept,
                "dropped": [
                    {"step": s, "reason": r, "documents": n}
                    for (s, r), n in sorted(dropped.items())
                ],
                "quarantined": 0,
                "by_split_domain": [
                    {"split": s, "domain": d, "documents": n, "chars": kept_chars[(s, d)]}
                    for (s, d), n in sorted(kept_docs.items())
                ],
            },
            "files": [f for w in writers.values() for f in w.files],
            "build_seconds": round(time.perf_counter() - start, 3),
        }
        if records_in != kept + sum(dropped.values()):
            raise RuntimeError("data stage lost records")  # conservation guard
        if not writers["train"].files or not writers["val"].files:
            raise DataError(
                f"data: {kept} documents kept, too few to fill both splits "
                f"(val_fraction={cfg.val_fraction})"
            )
        atomic_write_json(tmp / MANIFEST, manifest)
    return workspace.published("data", version, start)


def iter_split(data_dir: Path, manifest: dict[str, Any], split: str) -> Iterator[pa.Table]:
    """Stream one split of a data version shard by shard."""
    for f in manifest["files"]:
        if f["split"] == split:
            yield pq.read_table(data_dir / f["path"])
