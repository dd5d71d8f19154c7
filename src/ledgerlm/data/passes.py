"""The per-shard passes of the data stage, run by worker processes (local pool or Ray).

Each pass reads the previous pass's file for one shard, writes its own, and
leaves a completion marker holding its summary; a rerun skips every shard whose
marker exists. Only small summaries travel back to the driver.

Files under ``work`` for shard i:
  read-i.parquet      valid records            quarantine-i.parquet  malformed records
  clean-i.parquet     after templates+filters  drops-clean-i.parquet filter drops
  bands-i.npy         LSH band keys            shingles-i.u64/.npy   shingles (verify)
  decisions-i.parquet dedup/split decisions    drops-final-i.parquet dedup/contamination drops
  {train,val,test}-i.parquet (in the version folder) kept documents of each split present
"""

from __future__ import annotations

import hashlib
import pickle
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.config import DataConfig
from ledgerlm.data.budget import representative_weights
from ledgerlm.data.filters import build_filters
from ledgerlm.data.minhash import band_keys, minhash_flat, params_from_config
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined, Shard, quarantine_table
from ledgerlm.data.records import DOCUMENT_SCHEMA, Document, documents_to_table, table_to_documents
from ledgerlm.data.shingles import prenormalize, shingle_batch, shingles_and_digests, word_digests
from ledgerlm.data.steps import GroupStats, apply_filters_batch
from ledgerlm.data.templates import LineCounter, TemplateRemover
from ledgerlm.data.time_split import UNDATED, document_times, val_share
from ledgerlm.workspace import file_sha256

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
# the exact-dedup digest, the length, and the split drawn from the document's own id
# (index into SPLITS; the driver gives a cluster its keeper's)
CLEAN_EXTRA = [("digest", pa.binary(16)), ("chars", pa.int64()), ("split", pa.int8())]
# under data.split = "time": the date, microseconds since 1970 UTC (``time_split.UNDATED``)
TIME_COLUMN = ("time", pa.int64())
OUTPUT_EXTRA = [("weight", pa.float64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64())]
OUTPUT_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, *(pa.field(n, t) for n, t in OUTPUT_EXTRA)])
BATCH = 2_000
# Work files are read once, by the next pass, on the same machine: no compression,
# statistics or dictionary pages to build (the published shards keep zstd).
_WORK_FILE = {"compression": "none", "write_statistics": False, "use_dictionary": False}
# The splits a kept document can land in, in the order shards and files are listed.
SPLITS = ("train", "val", "test")


def split_of(unit: str, val_fraction: float, seed: int, test_fraction: float = 0.0) -> str:
    """A unit's split depends only on its key, so it is stable as the corpus grows.

    One hash draw ``u`` in [0, 1) per unit: ``u < val_fraction`` is val, the next
    ``test_fraction`` of the interval is test, the rest train. The val interval does not
    depend on ``test_fraction``, so with ``test_fraction = 0`` every unit keeps the split
    it had before the test split existed, and raising it only moves train units to test.
    """
    u = _draw(unit, seed)
    if u < val_fraction:
        return "val"
    if u < val_fraction + test_fraction:
        return "test"
    return "train"


def held_split(unit: str, val_share: float, seed: int) -> str:
    """Under a time split, the held-out split of a unit the cut holds out: val if its
    draw (the one ``split_of`` makes) is below ``val_share``, else test."""
    return "val" if _draw(unit, seed) < val_share else "test"


def _draw(unit: str, seed: int) -> float:
    h = hashlib.blake2b(f"{seed}:{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def cached(
    work: Path, name: str, compute: Callable[[], Any], consumed: tuple[str, ...] = ()
) -> Any:
    """Run ``compute`` once per shard and stage; a marker file holds its summary.

    The marker is written last and atomically, so its presence means every file
    of the step is complete. Markers are written and read only by this stage
    inside its private build folder. ``consumed``: work files that nothing reads once
    this step is done (the marker is written), removed then, by the worker, so the
    build's end does not spend its time deleting gigabytes.
    """
    marker = work / f"{name}.done"
    if marker.is_file():
        return pickle.loads(marker.read_bytes())
    result = compute()
    tmp = marker.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(marker)
    for file in consumed:
        (work / file).unlink(missing_ok=True)
    return result


def _drop(doc: Document, step: str, reason: str, cluster: str | None = None, kept=None) -> dict:
    return _drop_row(doc.id, doc.source, doc.domain, step, reason, cluster, kept)


def _drop_row(
    id_: str, source: str, domain: str, step: str, reason: str, cluster: str | None, kept
) -> dict:
    """A row of ``DROP_SCHEMA``."""
    return {
        "id": id_,
        "source": source,
        "domain": domain,
        "step": step,
        "reason": reason,
        "cluster_id": cluster,
        "kept": kept,
    }


def read_parquet(path: Path, columns: list[str] | None = None) -> pa.Table:
    """``pq.read_table`` without its dataset layer: that one imports ``pyarrow.dataset``
    and pandas, half a second, to read a single file."""
    return pq.ParquetFile(path).read(columns=columns)


def _batches(path: Path) -> Iterator[pa.Table]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        yield pa.Table.from_batches([batch])


# -- pass 1: read, quarantine, count template lines -------------------------------------


def read_pass(shard: Shard, cfg: DataConfig, work: str) -> dict[str, Any]:
    return cached(Path(work), f"read-{shard.index}", lambda: _read(shard, cfg, Path(work)))


def _read(shard: Shard, cfg: DataConfig, work: Path) -> dict[str, Any]:
    counter = LineCounter.from_config(cfg.templates)
    count_lines = cfg.templates.enabled
    quarantined: list[Quarantined] = []
    records_in = 0
    writer = pq.ParquetWriter(work / f"read-{shard.index}.parquet", DOCUMENT_SCHEMA, **_WORK_FILE)
    buffer: list[Document] = []
    try:
        for item in read_shard(shard, cfg.builtin):
            records_in += 1
            if type(item) is Quarantined:
                quarantined.append(item)
                continue
            if count_lines:
                counter.add(item)
            buffer.append(item)
            if len(buffer) >= BATCH:
                writer.write_table(documents_to_table(buffer))
                buffer = []
        if buffer:
            writer.write_table(documents_to_table(buffer))
    finally:
        writer.close()
    counter.compact()  # the driver merges keys, never hashes lines
    pq.write_table(quarantine_table(quarantined), work / f"quarantine-{shard.index}.parquet")
    return {
        "records_in": records_in,
        "quarantined": dict(Counter(q.reason for q in quarantined)),
        "unread_bytes": sum(q.unread_bytes for q in quarantined),
        "lines": counter,
    }


# -- pass 2: templates, filters, digests, MinHash -----------------------------------------


def clean_pass(index: int, cfg: DataConfig, templates: dict, work: str) -> dict[str, Any]:
    return cached(
        Path(work),
        f"clean-{index}",
        lambda: _clean(index, cfg, templates, Path(work)),
        consumed=(f"read-{index}.parquet",),
    )


def _clean(index: int, cfg: DataConfig, templates: dict, work: Path) -> dict[str, Any]:
    remover = TemplateRemover.from_config(templates, cfg.templates)
    filters = build_filters(cfg.filters)
    stats = GroupStats()
    near = cfg.near_dedup.enabled
    params = params_from_config(cfg.near_dedup) if near else None
    val_fraction, test_fraction = cfg.drawn_fractions()
    timed = cfg.split == "time"
    share = val_share(cfg) if timed else 0.0

    def split_code(unit: str) -> int:
        if timed:  # the side a held-out unit takes; the driver decides which are
            return SPLITS.index(held_split(unit, share, cfg.split_seed))
        return SPLITS.index(split_of(unit, val_fraction, cfg.split_seed, test_fraction))

    extra = [*CLEAN_EXTRA, *([TIME_COLUMN] if timed else [])]
    schema = pa.schema([*DOCUMENT_SCHEMA, *(pa.field(n, t) for n, t in extra)])
    writer = pq.ParquetWriter(work / f"clean-{index}.parquet", schema, **_WORK_FILE)
    drops: list[dict] = []
    keys: list[np.ndarray] = []
    flats: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    kept = 0
    try:
        for table in _batches(work / f"read-{index}.parquet"):
            docs = list(table_to_documents(table))
            if templates:  # (templates off: no template statistics at all)
                docs = [remover.apply(doc)[0] for doc in docs]
            survivors: list[Document] = []
            for doc, dropped in zip(docs, apply_filters_batch(filters, docs, stats), strict=True):
                if dropped is None:
                    survivors.append(doc)
                else:
                    drops.append(_drop(doc, *dropped))
            if not survivors:
                continue
            texts = [d.text for d in survivors]
            # NFKC + casefold once, and one scan of the words for the exact digest and
            # the shingles alike
            folded = prenormalize(texts) if cfg.exact_dedup or near else []
            batch = None
            if near:
                batch, words = shingles_and_digests(
                    folded, params.shingle_words, unique=False, normalized=True
                )
            elif cfg.exact_dedup:
                words = word_digests(folded, normalized=True)
            else:  # not compared: exact dedup keeps every document
                words = np.zeros((len(texts), 2), dtype=np.uint64)
            digests = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(16), len(texts), [None, pa.py_buffer(words.tobytes())]
            )
            out = documents_to_table(survivors)
            out = (
                out.append_column("digest", digests)
                .append_column("chars", pa.array([len(t) for t in texts], pa.int64()))
                .append_column("split", pa.array([split_code(d.id) for d in survivors], pa.int8()))
            )
            if timed:
                times = document_times(d.date for d in survivors)
                out = out.append_column("time", pa.array(times, pa.int64()))
            writer.write_table(out)
            kept += len(survivors)
            if batch is not None:
                # repeats kept: MinHash and the Jaccard of the shingle store ignore them,
                # so sorting every document into a set would be wasted work
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
            # raw, so the driver's shingle store can take the bytes as they are
            flat.astype("<u8", copy=False).tofile(work / f"shingles-{index}.u64")
            np.save(work / f"shingles-{index}.npy", offsets)
    pq.write_table(pa.Table.from_pylist(drops, DROP_SCHEMA), work / f"drops-clean-{index}.parquet")
    return {"kept": kept, "filters": stats, "templates": remover.stats}


def shingle_file(work: Path, index: int) -> Path:
    """The raw little-endian uint64 shingle hashes of a shard (offsets: ``.npy``)."""
    return work / f"shingles-{index}.u64"


# -- pass 3: apply decisions, contamination, write the version ---------------------------


def write_pass(
    index: int, cfg: DataConfig, work: str, out: str, eval_ngrams: str | None
) -> dict[str, Any]:
    return cached(
        Path(work),
        f"write-{index}",
        lambda: _write(index, cfg, Path(work), Path(out), eval_ngrams),
        consumed=(
            f"clean-{index}.parquet",
            f"decisions-{index}.parquet",
            f"shingles-{index}.u64",
            f"shingles-{index}.npy",
        ),
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
    """Column by column: the kept rows of each batch are taken from the cleaned table
    as Arrow arrays (no Python object per document), in batch order, one row group per
    batch and split as before."""
    decisions = read_parquet(work / f"decisions-{index}.parquet")
    status_all = np.asarray(decisions.column("status").to_pylist(), dtype=object)
    split_all = np.asarray(decisions.column("split").to_pylist(), dtype=object)
    cluster_col = decisions.column("cluster_id")
    kept_col = decisions.column("kept")
    size_col = decisions.column("cluster_size")
    evals = np.load(eval_ngrams) if eval_ngrams else None
    n = cfg.contamination.ngram
    writers: dict[str, pq.ParquetWriter] = {}
    drops: list[dict] = []
    counts: Counter[tuple[str, str]] = Counter()
    chars: Counter[tuple[str, str]] = Counter()
    undated: Counter[str] = Counter()  # a time split's kept documents without a date
    matched: list[np.ndarray] = []
    contaminated = 0
    row = 0
    doc_names = [f.name for f in DOCUMENT_SCHEMA]
    timed = cfg.split == "time"
    try:
        for table in _batches(work / f"clean-{index}.parquet"):
            m = table.num_rows
            status, split = status_all[row : row + m], split_all[row : row + m]
            cluster, size = cluster_col.slice(row, m), size_col.slice(row, m)
            live = status == "kept"
            overlap = np.zeros(m, dtype=bool)
            live_at = np.flatnonzero(live)
            if evals is not None and evals.size and live_at.size:
                texts = table.column("text").take(pa.array(live_at)).to_pylist()
                grams = shingle_batch(texts, n)
                hit = np.isin(grams.hashes, evals)
                per_doc = np.concatenate([[0], np.cumsum(hit)])[grams.offsets]
                overlap[live_at] = np.diff(per_doc) > 0
                matched.append(np.unique(grams.hashes[hit]))
            contaminated += int(overlap.sum())
            dropped = ~live | (overlap & cfg.contamination.drop)
            if dropped.any():
                at = np.flatnonzero(dropped)
                take = pa.array(at)
                ids = table.column("id").take(take).to_pylist()
                sources = table.column("source").take(take).to_pylist()
                domains = table.column("domain").take(take).to_pylist()
                clusters = cluster.take(take).to_pylist()
                keepers = kept_col.slice(row, m).take(take).to_pylist()
                for k, j in enumerate(at.tolist()):
                    if status[j] != "kept":
                        step, reason, keeper = status[j], "duplicate", keepers[k]
                    else:
                        step, reason, keeper = "contamination", f"{n}-gram overlap", None
                    drops.append(
                        _drop_row(ids[k], sources[k], domains[k], step, reason, clusters[k], keeper)
                    )
            row += m
            keep = ~dropped
            domain = np.asarray(table.column("domain").to_pylist(), dtype=object)
            length = table.column("chars").to_numpy()
            times = table.column("time").to_numpy() if timed else None
            for name in SPLITS:
                at = np.flatnonzero(keep & (split == name))
                if not at.size:
                    continue
                if times is not None:
                    undated[name] += int((times[at] == UNDATED).sum())
                for d, c in zip(domain[at].tolist(), length[at].tolist(), strict=True):
                    counts[(name, d)] += 1
                    chars[(name, d)] += c
                take = pa.array(at)
                rows = table.select(doc_names).take(take)
                sizes = size.take(take)
                weight = pa.array(representative_weights(sizes.to_numpy(), cfg.weights))
                part = pa.Table.from_arrays(
                    [*rows.columns, weight, cluster.take(take), sizes], schema=OUTPUT_SCHEMA
                )
                if name not in writers:
                    writers[name] = pq.ParquetWriter(
                        out / output_name(name, index), OUTPUT_SCHEMA, compression="zstd"
                    )
                writers[name].write_table(part)
    finally:
        for w in writers.values():
            w.close()
    pq.write_table(pa.Table.from_pylist(drops, DROP_SCHEMA), work / f"drops-final-{index}.parquet")
    hits = np.unique(np.concatenate(matched)) if matched else np.zeros(0, np.uint64)
    files = []
    for name in sorted(writers):  # the driver lists them without reading them again
        path = out / output_name(name, index)
        files.append(
            {
                "path": path.name,
                "split": name,
                "rows": sum(counts[(s, d)] for s, d in counts if s == name),
                "bytes": path.stat().st_size,
                "sha256": file_sha256(path),
            }
        )
    return {
        "files": files,
        "by_split_domain": [(s, d, counts[(s, d)], chars[(s, d)]) for s, d in sorted(counts)],
        "contaminated_docs": contaminated,
        "matched_ngrams": hits,
        **({"undated": {s: undated[s] for s in SPLITS}} if timed else {}),
    }
