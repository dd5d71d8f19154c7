"""The data stage: raw records -> a versioned, deduplicated, split training distribution.

Three per-shard passes run on the chosen executor (``data/passes.py``); between
them the driver makes the global decisions, holding only small per-document
arrays (a 16-byte digest, a few integers and the id), never the text:

  1. read      records -> valid documents + quarantine; count template lines
  2. clean     template removal, filters, exact digests, MinHash band keys
  -  decide    exact dedup, near-dedup clustering (out of core), keepers, splits
  3. write     apply decisions, contamination check, write train/val/test shards

The version id hashes the inputs' content and every parameter. The build
folder survives an interruption, and a rerun resumes from the shards that
finished; only the final rename makes a version visible.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.config import DataConfig, InputConfig
from ledgerlm.data import time_split
from ledgerlm.data.budget import budget
from ledgerlm.data.contamination import (
    EvalSet,
    contamination_report,
    load_eval_sets,
    near_hits,
)
from ledgerlm.data.dedup import exact_keepers, group_keepers, keeper_rank
from ledgerlm.data.executor import ShardPool, start_workers
from ledgerlm.data.held_out import FixedSplit, HeldOutError, write_fixed
from ledgerlm.data.manifest import build_manifest
from ledgerlm.data.minhash import params_from_config
from ledgerlm.data.passes import (
    DROP_SCHEMA,
    SPLITS,
    cached,
    clean_pass,
    read_parquet,
    read_pass,
    shingle_file,
    split_of,
    write_pass,
)
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.fingerprint import shard_fingerprint
from ledgerlm.data.read.pieces import split_shards
from ledgerlm.data.read.shard import QUARANTINE_SCHEMA, ReaderError, Shard
from ledgerlm.data.shingles import NORMALIZATION
from ledgerlm.data.templates import shard_template_lines
from ledgerlm.data.verify import verified
from ledgerlm.extras import check
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.workspace import (
    BUILD_INFO,
    MANIFEST,
    SCHEMA_VERSION,
    AlreadyPublished,
    BuiltVersion,
    Workspace,
    atomic_write_json,
    content_hash,
    file_sha256,
)

# (document, band) keys gathered from the shards before one append to the edge files.
_EDGE_BATCH = 1 << 21
# Rows per row group (at most one more part) of the merged drops and quarantine files.
_MERGE_ROWS = 1 << 16


class DataError(ValueError):
    """Bad data-stage input; the message names the input and the reason."""


def _shards(cfg: DataConfig, base: Path, dated: bool = False) -> list[Shard]:
    try:
        return expand_inputs(cfg.inputs(), base, dated=dated)
    except ReaderError as err:
        raise DataError(str(err)) from None


def check_inputs(cfg: DataConfig, base: Path | None = None) -> list[Shard]:
    """Every input and evaluation file of ``cfg`` exists (a glob matches something).

    Cheap (names and folder listings only, no file is read) and writes nothing, so a
    caller can check a recipe before creating anything; raises ``DataError``, one line
    naming the input. ``prepare_data`` makes the same check first.
    """
    base = base or Path.cwd()
    if cfg.executor == "ray":
        check("ray", "executor 'ray'")
    if cfg.split == "time" and not sum(cfg.drawn_fractions()):
        raise DataError(
            'data.split = "time" has no split to hold out into: the val split is fixed by '
            "[eval] sources and there is no test split drawn from the sources (set "
            "data.test_fraction > 0, or leave [eval] sources unset)"
        )
    # a time split reads the training records' dates strictly
    shards = _shards(cfg, base, dated=cfg.split == "time")
    for name in cfg.contamination.eval_files:
        _shards(cfg.model_copy(update={"sources": [InputConfig(path=name)]}), base)
    for inputs in cfg.held_out_inputs().values():
        _shards(cfg.model_copy(update={"sources": inputs}), base)
    return shards


def data_version(
    cfg: DataConfig, base: Path | None = None
) -> tuple[str, list[Shard], list[dict[str, Any]]]:
    """The version id names the inputs' content hashes and every parameter.

    Hashes every input byte; a missing input raises ``DataError`` before any is read.
    """
    base = base or Path.cwd()
    shards = check_inputs(cfg, base)
    inputs = [
        {
            "source": s.source,
            "format": s.format,
            "path": s.path,
            "files": len(s.files) or 1,
            "fingerprint": shard_fingerprint(s, cfg.builtin),
        }
        for s in shards
    ]
    evals = []
    for name in cfg.contamination.eval_files:
        for s in _shards(cfg.model_copy(update={"sources": [InputConfig(path=name)]}), base):
            evals.append({"eval": name, "fingerprint": shard_fingerprint(s, cfg.builtin)})
    for split, held in cfg.held_out_inputs().items():
        for s in _shards(cfg.model_copy(update={"sources": held}), base):
            evals.append({"fixed": split, "fingerprint": shard_fingerprint(s, cfg.builtin)})
    content = [{k: i[k] for k in ("source", "format", "fingerprint")} for i in inputs]
    # how shards are executed never changes the content, nor how training samples the
    # domains, so neither is part of the id
    params = cfg.model_dump(mode="json", exclude={"executor", "workers", "mixture"})
    version = content_hash("data", SCHEMA_VERSION, content, evals, params)
    return version, shards, inputs


def prepare_data(
    cfg: DataConfig,
    workspace: Workspace,
    progress: Progress | None = None,
    base: Path | None = None,
    verify: bool = True,
) -> BuiltVersion:
    """Build (or reuse, or resume) the data version for ``cfg``.

    Missing inputs raise ``DataError`` before anything is written. Another process
    building the same version is waited for (a progress task says so) and its version
    reused. A build that fails on its input (``DataError``) removes its build folder;
    an interrupted one keeps it, and the next build resumes from its finished shards.
    A reused version is checked against its manifest first (``data.verify``; without
    ``verify``, everything but the content hashes).
    """
    progress = progress or NullProgress()
    base = base or Path.cwd()
    start = time.perf_counter()
    version, shards, inputs = data_version(cfg, base)  # checks the inputs first
    if reused := workspace.reuse("data", version, start):
        return verified(reused, verify)
    try:
        with workspace.building(
            "data", version, resumable=True, progress=progress, discard_on=(DataError,)
        ) as out:
            try:
                _build(cfg, version, shards, inputs, base, out, progress, start)
            except ReaderError as err:  # an input that changed or vanished since it was listed
                raise DataError(str(err)) from None
    except AlreadyPublished:
        return verified(workspace.published("data", version, start, reused=True), verify)
    return workspace.published("data", version, start)


def _build(
    cfg: DataConfig,
    version: str,
    files: list[Shard],
    inputs: list[dict[str, Any]],
    base: Path,
    out: Path,
    progress: Progress,
    start: float,
) -> None:
    # The work units: big files cut into pieces (the same cuts whatever the worker count)
    shards = split_shards(files)
    if len(shards) > 1:
        start_workers(cfg.executor, cfg.workers)  # it imports while the build sets up
    work = out / "_work"
    work.mkdir(exist_ok=True)
    _check_plan(work, out, shards)
    with ShardPool(cfg.executor, cfg.workers, len(shards)) as pool:

        def run(name: str, fn, jobs: list[tuple]) -> list[Any]:
            with progress.task(name, total=len(jobs)) as task:
                return pool.map(fn, jobs, lambda _: task.advance(1))

        _passes(cfg, version, shards, inputs, base, out, progress, start, work, run)


def _check_plan(work: Path, out: Path, shards: list[Shard]) -> None:
    """A resumed build must cut its inputs as the interrupted one did: its finished
    shards are reused only under the same plan; otherwise (a build left by an older
    ledgerlm) it starts over."""
    plan = [(s.path, s.format, s.start, s.stop, s.first, s.files) for s in shards]
    digest = content_hash("plan", plan)
    marker = work / "plan.txt"
    if marker.is_file() and marker.read_text() == digest:
        return
    for old in work.iterdir():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    for split in SPLITS:
        for old in out.glob(f"{split}-*.parquet"):
            old.unlink()
    marker.write_text(digest)


def _passes(
    cfg: DataConfig,
    version: str,
    shards: list[Shard],
    inputs: list[dict[str, Any]],
    base: Path,
    out: Path,
    progress: Progress,
    start: float,
    work: Path,
    run: Callable[[str, Callable[..., Any], list[tuple]], list[Any]],
) -> None:
    read = run("data: read", read_pass, [(s, cfg, str(work)) for s in shards])
    # read-i files go as soon as their shard is cleaned: count duplicate ids before
    duplicate_ids = cached(work, "ids", lambda: _duplicate_ids(shards, work))
    templates: dict = {}
    if cfg.templates.enabled:
        templates = shard_template_lines([r["lines"] for r in read], cfg.templates)
    for r in read:  # (kept in the read markers for a resumed build; not needed here again)
        r.pop("lines", None)
    clean = run("data: clean", clean_pass, [(s.index, cfg, templates, str(work)) for s in shards])
    with progress.task("data: dedup", total=1) as task:
        # cached: a resumed build whose write pass began finds no clean-i files to decide on
        decided = cached(work, "decide", lambda: _decide(cfg, shards, clean, work))
        task.advance(1)
    fixed = _fixed_sets(cfg, base, out, progress)
    evals = load_eval_sets(cfg.contamination, base, cfg.builtin, cfg.near_dedup)
    evals += [f.evalset for f in fixed if f.evalset is not None]
    eval_path = None
    if evals:
        eval_path = str(work / "eval-ngrams.npy")
        np.save(eval_path, np.unique(np.concatenate([e.all_ngrams for e in evals])))
    written = run(
        "data: write",
        write_pass,
        [(s.index, cfg, str(work), str(out), eval_path) for s in shards],
    )
    files = _merge_outputs(shards, written, work, out, fixed)
    manifest = build_manifest(
        cfg=cfg,
        version=version,
        inputs=inputs,
        read=read,
        clean=clean,
        decided=decided,
        written=written,
        contamination=_contamination(cfg, evals, shards, written, work),
        files=files,
        drops_path=out / "drops.parquet",
        duplicate_ids=duplicate_ids,
        fixed=fixed,
    )
    shutil.rmtree(work)
    atomic_write_json(out / BUILD_INFO, {"build_seconds": time.perf_counter() - start})
    atomic_write_json(out / MANIFEST, manifest)


def _fixed_sets(cfg: DataConfig, base: Path, out: Path, progress: Progress) -> list[FixedSplit]:
    if not cfg.held_out_inputs():
        return []
    with progress.task("data: fixed held-out sets", total=1) as task:
        try:
            fixed = write_fixed(cfg, base, out)
        except HeldOutError as err:
            raise DataError(str(err)) from None
        task.advance(1)
    return fixed


def _duplicate_ids(shards: list[Shard], work: Path) -> int:
    """Documents whose id an earlier document (of any source) already carries."""
    seen: set[str] = set()
    n = 0
    for s in shards:
        ids = read_parquet(work / f"read-{s.index}.parquet", ["id"]).column("id").to_pylist()
        n += len(ids)
        seen.update(ids)
    return n - len(seen)


def _contamination(
    cfg: DataConfig, evals: list[EvalSet], shards: list[Shard], written: list[dict], work: Path
) -> dict[str, Any]:
    overlapping = sum(w["contaminated_docs"] for w in written)
    if not evals:
        return {"files": [], "train_documents_overlapping": overlapping}
    matched = [w["matched_ngrams"] for w in written if w["matched_ngrams"].size]
    hits = np.unique(np.concatenate(matched)) if matched else np.zeros(0, np.uint64)
    near = None
    if cfg.near_dedup.enabled:
        near = [np.zeros(len(e.doc_ngrams), dtype=bool) for e in evals]
        for s in shards:
            for i, h in enumerate(near_hits(evals, np.load(work / f"bands-{s.index}.npy"))):
                near[i] |= h
    report = contamination_report(evals, hits, near)
    report.update(
        ngram=cfg.contamination.ngram,
        drop=cfg.contamination.drop,
        train_documents_overlapping=overlapping,
    )
    return report


def _merge_outputs(
    shards: list[Shard], written: list[dict], work: Path, out: Path, fixed: list[FixedSplit]
) -> list[dict[str, Any]]:
    """One quarantine and one drops file, in input order; the list of output shards (the
    fixed held-out sets' shards among them).

    Drops go file by file (the filter drops of its pieces, then its dedup and
    contamination drops), and rows are written in row groups of ``_MERGE_ROWS`` whatever
    the pieces held, so neither file depends on how the inputs were cut.
    """
    files_of: list[list[int]] = []  # the pieces of each input file, in order
    for s in shards:
        if s.start == 0 or not files_of:
            files_of.append([])
        files_of[-1].append(s.index)
    drop_parts = [
        f"drops-{step}-{i}.parquet"
        for group in files_of
        for step in ("clean", "final")
        for i in group
    ]
    quarantine_parts = [f"quarantine-{s.index}.parquet" for s in shards]
    for name, parts, schema in (
        ("quarantine.parquet", quarantine_parts, QUARANTINE_SCHEMA),
        ("drops.parquet", drop_parts, DROP_SCHEMA),
    ):
        with pq.ParquetWriter(out / name, schema, compression="zstd") as writer:
            pending: list[pa.Table] = []
            rows = written_rows = 0
            for part in parts:
                table = read_parquet(work / part)
                if table.num_rows:
                    pending.append(table)
                    rows += table.num_rows
                if rows >= _MERGE_ROWS:
                    writer.write_table(pa.concat_tables(pending))
                    written_rows += rows
                    pending, rows = [], 0
            if pending or not written_rows:
                writer.write_table(pa.concat_tables(pending) if pending else schema.empty_table())
    files = [f for w in written for f in w["files"]]  # rows and sha256 from the workers
    for f in fixed:
        files += [
            {**x, "bytes": (out / x["path"]).stat().st_size, "sha256": file_sha256(out / x["path"])}
            for x in f.files
        ]
    return sorted(files, key=lambda f: (SPLITS.index(f["split"]), f["path"]))


def _decide(cfg: DataConfig, shards: list[Shard], clean: list[dict], work: Path) -> dict:
    """Global dedup and split decisions, written per shard as ``decisions-i.parquet``."""
    counts = np.array([c["kept"] for c in clean], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    names = ["id", "source", "date", "digest", "chars", "split"]
    cols: dict[str, list] = {k: [] for k in names + (["time"] if cfg.split == "time" else [])}
    for s in shards:
        t = read_parquet(work / f"clean-{s.index}.parquet", list(cols))
        for k in cols:
            cols[k].append(t.column(k))
    ids = np.array([x for c in cols["id"] for x in c.to_pylist()], dtype=object)
    sources = np.array([x for c in cols["source"] for x in c.to_pylist()], dtype=object)
    dates = np.array([x for c in cols["date"] for x in c.to_pylist()], dtype=object)
    chars = np.array([x for c in cols["chars"] for x in c.to_pylist()], dtype=np.int64)
    own_split = np.array([x for c in cols["split"] for x in c.to_pylist()], dtype=np.int8)
    digests = _digests(cols["digest"], n)
    rank = keeper_rank(cfg.near_dedup.keeper, chars, dates)
    exact = exact_keepers(digests, rank) if cfg.exact_dedup else np.arange(n)
    near_stats: dict[str, Any] = {"enabled": cfg.near_dedup.enabled}
    labels = exact
    if cfg.near_dedup.enabled and n:
        labels, near_stats = _near_clusters(cfg, shards, offsets, exact, work)
    keeper = group_keepers(labels, rank)
    doc = np.arange(n)
    status = np.where(keeper == doc, "kept", np.where(exact != doc, "exact_dedup", "near_dedup"))
    size = np.bincount(labels, minlength=n)[labels] if n else np.zeros(0, np.int64)
    cluster_id = ids[keeper] if n else ids
    unit = {"cluster": cluster_id, "source": sources, "document": ids, "time": cluster_id}[
        cfg.split
    ]
    val_fraction, test_fraction = cfg.drawn_fractions()
    timed: dict[str, Any] = {}
    # the workers drew each document's split from its id (``split_code``); a cluster
    # takes its keeper's, and a source (a handful) is drawn here
    if cfg.split == "source":
        drawn = {u: split_of(u, val_fraction, cfg.split_seed, test_fraction) for u in set(unit)}
        split = np.array([drawn[u] for u in unit], dtype=object)
    elif cfg.split == "time":  # held out by the cut, then val or test as the keeper drew
        times = np.concatenate([c.to_numpy() for c in cols["time"]]) if n else np.zeros(0, int)
        held = time_split.held_out(labels, times, cfg.split_cut())
        code = np.where(held, own_split[keeper], 0)
        split = np.array(SPLITS, dtype=object)[code] if n else np.zeros(0, object)
        timed = {"time": time_split.summary(cfg, times, held, status == "kept")}
    else:
        code = own_split[keeper] if cfg.split == "cluster" else own_split
        split = np.array(SPLITS, dtype=object)[code] if n else np.zeros(0, object)
    _check_held_out(cfg, split[status == "kept"], unit[status == "kept"])
    for s in shards:
        a, b = offsets[s.index], offsets[s.index + 1]
        table = pa.table(
            {
                "status": pa.array(status[a:b].tolist(), pa.string()),
                "cluster_id": pa.array(cluster_id[a:b].tolist(), pa.string()),
                "kept": pa.array(
                    [
                        None if st == "kept" else k
                        for st, k in zip(status[a:b], cluster_id[a:b], strict=True)
                    ],
                    pa.string(),
                ),
                "cluster_size": pa.array(size[a:b], pa.int64()),
                "split": pa.array(split[a:b].tolist(), pa.string()),
            }
        )
        pq.write_table(table, work / f"decisions-{s.index}.parquet")
    kept = status == "kept"
    multi = np.flatnonzero(kept & (size > 1))
    top = multi[np.lexsort((rank[multi], -size[multi]))][:10]
    return {
        **timed,
        "documents": n,
        "exact": {
            "enabled": cfg.exact_dedup,
            "normalization": NORMALIZATION,
            "dropped": int((status == "exact_dedup").sum()),
        },
        "near": {**near_stats, "dropped": int((status == "near_dedup").sum())},
        "keeper": cfg.near_dedup.keeper,
        "clusters_with_duplicates": int(multi.size),
        "top_clusters": [
            {
                "cluster_id": str(ids[k]),
                "size": int(size[k]),
                "members": [str(m) for m in ids[labels == labels[k]][:5]],
            }
            for k in top
        ],
        "budget_chars": budget(chars, kept).to_dict(),
    }


def _digests(columns: list[pa.ChunkedArray], n: int) -> np.ndarray:
    """(n, 2) uint64 from the 16-byte digest columns, read from their Arrow buffers."""
    parts = [np.zeros(0, np.uint8)]
    for column in columns:
        for chunk in column.chunks:
            raw = np.frombuffer(chunk.buffers()[1], dtype=np.uint8)
            parts.append(raw[chunk.offset * 16 : (chunk.offset + len(chunk)) * 16])
    return np.concatenate(parts).view(np.uint64).reshape(n, 2)


def _check_held_out(cfg: DataConfig, split: np.ndarray, unit: np.ndarray) -> None:
    """A held-out split that drew no document stops the build here, before any tokenizer
    or training work, naming what to change."""
    val_fraction, test_fraction = cfg.drawn_fractions()
    wanted = [("val", "val_fraction", val_fraction), ("test", "test_fraction", test_fraction)]
    for name, key, fraction in [w for w in wanted if w[2] > 0]:
        if len(split) and not (split == name).any() and cfg.split == "time":
            held = len(set(unit[split != "train"].tolist()))
            if not held:
                raise DataError(
                    f"the {name} split is empty: none of the {len(split)} kept document(s) "
                    f"is dated on or after data.split_time = {cfg.split_time} (a cluster goes "
                    "with its earliest dated member). Set an earlier split_time, or name the "
                    "field of the records' dates with date_field on the source"
                )
            raise DataError(
                f"the {name} split is empty: the {held} held-out cluster(s) after "
                f"data.split_time = {cfg.split_time} all drew the other held-out split. Set "
                f"an earlier split_time, or raise data.{key}"
            )
        if len(split) and not (split == name).any():
            units = len(set(unit.tolist()))
            raise DataError(
                f"the {name} split is empty: data.{key} = {fraction:g} drew none of the "
                f"{units} {cfg.split} unit(s) of {len(split)} kept document(s). Give it more "
                'documents: cut long text files with split = "blank_lines", "lines" or '
                "{chunk_chars = N} on the source, split by document (data.split = "
                f'"document"), or raise data.{key}'
            )


def _near_clusters(cfg, shards, offsets, exact, work) -> tuple[np.ndarray, dict[str, Any]]:
    """Cluster exact-keepers by MinHash LSH; every other document follows its keeper."""
    from ledgerlm.data.cluster import EdgeIndex, ShingleStore, cluster

    params = params_from_config(cfg.near_dedup)
    n = int(offsets[-1])
    index = EdgeIndex(work / "edges", params, cfg.near_dedup.partitions)
    store = ShingleStore(work / "shingles") if cfg.near_dedup.verify else None
    ids: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    for s in shards:
        gids = np.arange(offsets[s.index], offsets[s.index + 1])
        keep = exact[gids] == gids  # exact duplicates are not compared again
        ids.append(gids[keep])
        keys.append(np.load(work / f"bands-{s.index}.npy")[keep])
        if sum(len(k) for k in ids) * params.bands >= _EDGE_BATCH or s is shards[-1]:
            index.add(np.concatenate(ids), np.concatenate(keys))  # 16 appends per batch
            ids, keys = [], []
        if store is not None:
            at = np.load(work / f"shingles-{s.index}.npy")
            store.add_file(np.where(keep, gids, -1), shingle_file(work, s.index), at)
    result = cluster(
        index,
        n,
        verify=store.jaccard if store is not None else None,
        threshold=params.threshold if store is not None else None,
    )
    return result.labels[exact], {
        "enabled": True,
        "params": params.to_dict(),
        "verify": cfg.near_dedup.verify,
        **result.to_dict(),
    }
