"""The per-shard passes of the data stage, run by worker processes (local pool or Ray).

Each pass reads the previous pass's file for one shard, writes its own, and
leaves a completion marker holding its summary; a rerun skips every shard whose
marker exists. Only small summaries travel back to the driver.

Files under ``work`` for shard i:
  read-i.parquet      valid records            quarantine-i.parquet  malformed records
  clean-i.parquet     after templates+filters  drops-clean-i.parquet filter drops
  bands-i.npy         LSH band keys            shingles-i.npz        shingle sets (verify)
  decisions-i.parquet dedup/split decisions    drops-final-i.parquet dedup/contamination drops
  {train,val,test}-i.parquet (in the version folder) kept documents of each split present
"""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.config import DataConfig
from ledgerlm.data.dedup import text_digest
from ledgerlm.data.filters import build_filters
from ledgerlm.data.minhash import band_keys, minhash_flat, params_from_config, shingle_batch
from ledgerlm.data.readers import Quarantined, Shard, quarantine_table, read_shard
from ledgerlm.data.records import DOCUMENT_SCHEMA, Document, documents_to_table, table_to_documents
from ledgerlm.data.steps import GroupStats, apply_filters
from ledgerlm.data.templates import LineCounter, TemplateRemover

DROP_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("domain", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("cluster_id", pa.string()),
        ("kept", pa.string()),
    ]
)
CLEAN_EXTRA = [("digest", pa.binary(16)), ("chars", pa.int64())]
OUTPUT_EXTRA = [("weight", pa.float64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64())]
OUTPUT_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, *(pa.field(n, t) for n, t in OUTPUT_EXTRA)])
BATCH = 2_000
# The splits a kept document can land in, in the order shards and files are listed.
SPLITS = ("train", "val", "test")


def cached(work: Path, name: str, compute: Callable[[], Any]) -> Any:
    """Run ``compute`` once per shard and stage; a marker file holds its summary.

    The marker is written last and atomically, so its presence means every file
    of the step is complete. Markers are written and read only by this stage
    inside its private build folder.
    """
    marker = work / f"{name}.done"
    if marker.is_file():
        return pickle.loads(marker.read_bytes())
    result = compute()
    tmp = marker.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(marker)
    return result


def _drop(doc: Document, step: str, reason: str, cluster: str | None = None, kept=None) -> dict:
    return {
        "id": doc.id,
        "source": doc.source,
        "domain": doc.domain,
        "step": step,
        "reason": reason,
        "cluster_id": cluster,
        "kept": kept,
    }


def _batches(path: Path) -> Iterator[pa.Table]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        yield pa.Table.from_batches([batch])


# -- pass 1: read, quarantine, count template lines -------------------------------------


def read_pass(shard: Shard, cfg: DataConfig, work: str) -> dict[str, Any]:
    return cached(Path(work), f"read-{shard.index}", lambda: _read(shard, cfg, Path(work)))


def _read(shard: Shard, cfg: DataConfig, work: Path) -> dict[str, Any]:
    counter = LineCounter.from_config(cfg.templates)
    quarantined: list[Quarantined] = []
    records_in = 0
    writer = pq.ParquetWriter(work / f"read-{shard.index}.parquet", DOCUMENT_SCHEMA)
    buffer: list[Document] = []
    try:
        for item in read_shard(shard, cfg.builtin):
            records_in += 1
            if isinstance(item, Quarantined):
                quarantined.append(item)
                continue
            if cfg.templates.enabled:
                counter.add(item)
            buffer.append(item)
            if len(buffer) >= BATCH:
                writer.write_table(documents_to_table(buffer))
                buffer = []
        if buffer:
            writer.write_table(documents_to_table(buffer))
    finally:
        writer.close()
    pq.write_table(quarantine_table(quarantined), work / f"quarantine-{shard.index}.parquet")
    return {
        "records_in": records_in,
        "quarantined": dict(Counter(q.reason for q in quarantined)),
        "unread_bytes": sum(q.unread_bytes for q in quarantined),
        "lines": counter,
    }


# -- pass 2: templates, filters, digests, MinHash -----------------------------------------


def clean_pass(index: int, cfg: DataConfig, templates: dict, work: str) -> dict[str, Any]:
    return cached(Path(work), f"clean-{index}", lambda: _clean(index, cfg, templates, Path(work)))


def _clean(index: int, cfg: DataConfig, templates: dict, work: Path) -> dict[str, Any]:
    remover = TemplateRemover.from_config(templates, cfg.templates)
    filters = build_filters(cfg.filters)
    stats = GroupStats()
    near = cfg.near_dedup.enabled
    params = params_from_config(cfg.near_dedup) if near else None
    schema = pa.schema([*DOCUMENT_SCHEMA, *(pa.field(n, t) for n, t in CLEAN_EXTRA)])
    writer = pq.ParquetWriter(work / f"clean-{index}.parquet", schema)
    drops: list[dict] = []
    keys: list[np.ndarray] = []
    flats: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    kept = 0
    try:
        for table in _batches(work / f"read-{index}.parquet"):
            survivors: list[Document] = []
            for doc in table_to_documents(table):
                if templates:
                    doc, _, _ = remover.apply(doc)
                dropped = apply_filters(filters, doc, stats)
                if dropped is None:
                    survivors.append(doc)
                else:
                    drops.append(_drop(doc, *dropped))
            if not survivors:
                continue
            out = documents_to_table(survivors)
            out = out.append_column(
                "digest", pa.array([text_digest(d.text) for d in survivors], pa.binary(16))
            ).append_column("chars", pa.array([len(d.text) for d in survivors], pa.int64()))
            writer.write_table(out)
            kept += len(survivors)
            if near:
                batch = shingle_batch([d.text for d in survivors], params.shingle_words)
                keys.append(band_keys(minhash_flat(batch.hashes, batch.offsets, params), params))
                if cfg.near_dedup.verify:
                    flats.append(batch.hashes)
                    counts.append(batch.counts())
    finally:
        writer.close()
    if near:
        bands = np.concatenate(keys) if keys else np.zeros((0, params.bands), np.uint64)
        np.save(work / f"bands-{index}.npy", bands)
        if cfg.near_dedup.verify:
            sizes = np.concatenate(counts) if counts else np.zeros(0, np.int64)
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            flat = np.concatenate(flats) if flats else np.zeros(0, np.uint64)
            np.savez(work / f"shingles-{index}.npz", flat=flat, offsets=offsets)
    pq.write_table(pa.Table.from_pylist(drops, DROP_SCHEMA), work / f"drops-clean-{index}.parquet")
    return {"kept": kept, "filters": stats, "templates": remover.stats}


def load_shingles(work: Path, index: int) -> list[np.ndarray]:
    data = np.load(work / f"shingles-{index}.npz")
    flat, offsets = data["flat"], data["offsets"]
    return [flat[a:b] for a, b in itertools.pairwise(offsets)]


# -- pass 3: apply decisions, contamination, write the version ---------------------------


def write_pass(
    index: int, cfg: DataConfig, work: str, out: str, eval_ngrams: str | None
) -> dict[str, Any]:
    return cached(
        Path(work), f"write-{index}", lambda: _write(index, cfg, Path(work), Path(out), eval_ngrams)
    )


def doc_row(doc: Document, weight: float, cluster: str, size: int) -> dict[str, Any]:
    return {
        "id": doc.id,
        "text": doc.text,
        "source": doc.source,
        "domain": doc.domain,
        "lang": doc.lang,
        "date": doc.date,
        "meta": doc.meta,
        "weight": weight,
        "cluster_id": cluster,
        "cluster_size": size,
    }


def output_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.parquet"


def _write(
    index: int, cfg: DataConfig, work: Path, out: Path, eval_ngrams: str | None
) -> dict[str, Any]:
    decisions = pq.read_table(work / f"decisions-{index}.parquet").to_pydict()
    evals = np.load(eval_ngrams) if eval_ngrams else None
    n = cfg.contamination.ngram
    writers: dict[str, pq.ParquetWriter] = {}
    drops: list[dict] = []
    counts: Counter[tuple[str, str]] = Counter()
    chars: Counter[tuple[str, str]] = Counter()
    matched: list[np.ndarray] = []
    contaminated = 0
    row = 0
    try:
        for table in _batches(work / f"clean-{index}.parquet"):
            rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
            docs = list(table_to_documents(table.drop_columns([c for c, _ in CLEAN_EXTRA])))
            d = {k: v[row : row + len(docs)] for k, v in decisions.items()}
            row += len(docs)
            overlap = np.zeros(len(docs), dtype=bool)
            live = np.flatnonzero(np.asarray(d["status"], dtype=object) == "kept")
            if evals is not None and evals.size and live.size:
                grams = shingle_batch([docs[j].text for j in live], n)
                hit = np.isin(grams.hashes, evals)
                per_doc = np.concatenate([[0], np.cumsum(hit)])[grams.offsets]
                overlap[live] = np.diff(per_doc) > 0
                matched.append(np.unique(grams.hashes[hit]))
            for j, doc in enumerate(docs):
                status, split = d["status"][j], d["split"][j]
                cluster, keeper, size = d["cluster_id"][j], d["kept"][j], d["cluster_size"][j]
                if status != "kept":
                    drops.append(_drop(doc, status, "duplicate", cluster, keeper))
                    continue
                if overlap[j]:
                    contaminated += 1
                    if cfg.contamination.drop:
                        drops.append(_drop(doc, "contamination", f"{n}-gram overlap", cluster))
                        continue
                weight = float(size) if cfg.weights == "preserve" else 1.0
                rows[split].append(doc_row(doc, weight, cluster, size))
                counts[(split, doc.domain)] += 1
                chars[(split, doc.domain)] += len(doc.text)
            for split, part in rows.items():
                if not part:
                    continue
                if split not in writers:
                    writers[split] = pq.ParquetWriter(
                        out / output_name(split, index), OUTPUT_SCHEMA, compression="zstd"
                    )
                writers[split].write_table(pa.Table.from_pylist(part, OUTPUT_SCHEMA))
    finally:
        for w in writers.values():
            w.close()
    pq.write_table(pa.Table.from_pylist(drops, DROP_SCHEMA), work / f"drops-final-{index}.parquet")
    hits = np.unique(np.concatenate(matched)) if matched else np.zeros(0, np.uint64)
    return {
        "splits": sorted(writers),
        "by_split_domain": [(s, d, counts[(s, d)], chars[(s, d)]) for s, d in sorted(counts)],
        "contaminated_docs": contaminated,
        "matched_ngrams": hits,
    }
