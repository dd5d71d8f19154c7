"""The data manifest (D9): everything needed to know what a version is and how it came to be.

Drop counts are read back from the version's own ``drops.parquet`` and
``quarantine.parquet``, so the funnel in the manifest cannot disagree with the
files beside it; the conservation equation is checked before publishing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ledgerlm.config import DataConfig
from ledgerlm.data import time_split
from ledgerlm.data.filters import build_filters
from ledgerlm.data.held_out import KEYS, FixedSplit
from ledgerlm.data.passes import SPLITS
from ledgerlm.data.templates import TemplateStats
from ledgerlm.workspace import SCHEMA_VERSION

SAMPLE_DROPS = 3


class ConservationError(RuntimeError):
    """Records in != kept + dropped + quarantined, or a split's files do not hold its
    counted documents: a bug, never published."""


def _drops(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Drop counts per (step, reason) and a few examples of each, in file order."""
    counts: Counter[tuple[str, str]] = Counter()
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
        for row in batch.to_pylist():
            key = (row["step"], row["reason"])
            counts[key] += 1
            bucket = samples.setdefault(key, [])
            if len(bucket) < SAMPLE_DROPS:
                bucket.append({k: v for k, v in row.items() if v is not None})
    dropped = [{"step": s, "reason": r, "documents": n} for (s, r), n in sorted(counts.items())]
    return dropped, [x for key in sorted(samples) for x in samples[key]]


def _time(decided: dict[str, Any], written: list[dict[str, Any]]) -> dict[str, Any]:
    """A time split's cut and its kept undated documents per split (none otherwise)."""
    if "time" not in decided:
        return {}
    undated = {s: sum(w["undated"][s] for w in written) for s in SPLITS}
    return {"time": {**decided["time"], "undated": undated}}


def build_manifest(
    *,
    cfg: DataConfig,
    version: str,
    inputs: list[dict[str, Any]],
    read: list[dict[str, Any]],
    clean: list[dict[str, Any]],
    decided: dict[str, Any],
    written: list[dict[str, Any]],
    contamination: dict[str, Any],
    files: list[dict[str, Any]],
    drops_path: Path,
    duplicate_ids: int = 0,
    fixed: Sequence[FixedSplit] = (),
) -> dict[str, Any]:
    records_in = sum(r["records_in"] for r in read)
    val_fraction, test_fraction = cfg.drawn_fractions()
    held = cfg.held_out_inputs()
    # compressed bytes after the last point a damaged stream was read to (a read summary
    # from a build started before this count existed has none)
    unread_bytes = sum(r.get("unread_bytes", 0) for r in read)
    quarantined: Counter[str] = Counter()
    for r in read:
        quarantined.update(r["quarantined"])
    filters = clean[0]["filters"] if clean else None
    templates = TemplateStats()
    for c in clean:
        templates.merge(c["templates"])
    for c in clean[1:]:
        filters.merge(c["filters"])
    by_split_domain: Counter[tuple[str, str]] = Counter()
    chars: Counter[tuple[str, str]] = Counter()
    for w in written:
        for split, domain, n, ch in w["by_split_domain"]:
            by_split_domain[(split, domain)] += n
            chars[(split, domain)] += ch
    kept = sum(by_split_domain.values())
    for f in fixed:  # the fixed held-out sets: read as given, outside the funnel
        for domain, n in f.by_domain.items():
            by_split_domain[(f.split, domain)] += n
            chars[(f.split, domain)] += f.chars[domain]
    n_fixed = sum(f.records for f in fixed)
    dropped, samples = _drops(drops_path)
    n_dropped = sum(d["documents"] for d in dropped)
    n_quarantined = sum(quarantined.values())
    if records_in != kept + n_dropped + n_quarantined:
        raise ConservationError(
            f"records in {records_in} != kept {kept} + dropped {n_dropped} "
            f"+ quarantined {n_quarantined}"
        )
    # kept = train + val + test, and each split's files hold exactly its documents
    by_split = {s: 0 for s in SPLITS}
    for (split, _), n in by_split_domain.items():
        by_split[split] += n
    in_files = {s: sum(f["rows"] for f in files if f["split"] == s) for s in SPLITS}
    if in_files != by_split or sum(by_split.values()) != kept + n_fixed:
        raise ConservationError(f"documents per split {by_split} != rows in files {in_files}")
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "data",
        "version": version,
        "inputs": inputs,
        "config": cfg.model_dump(mode="json", exclude={"executor", "workers"}),
        "steps": [
            {
                "name": "read",
                "stats": {
                    "records_in": records_in,
                    "quarantined": dict(sorted(quarantined.items())),
                },
            },
            {
                "name": "templates",
                "params": cfg.templates.model_dump(mode="json"),
                "stats": templates.to_dict(),
            },
            {
                "name": "filters",
                "params": [{"name": f.name, **f.params()} for f in build_filters(cfg.filters)],
                "stats": filters.totals() if filters else {},
                "groups": filters.rows() if filters else [],
            },
            {"name": "exact_dedup", **decided["exact"]},
            {"name": "near_dedup", **decided["near"]},
            {"name": "contamination", **contamination},
        ],
        "clusters": {
            "keeper": decided["keeper"],
            "with_duplicates": decided["clusters_with_duplicates"],
            "top": decided["top_clusters"],
        },
        "split": {
            "method": time_split.METHOD
            if cfg.split == "time"
            else f"per {cfg.split}: hash of its key, u in [0, 1); val if u < val_fraction, "
            "test if u < val_fraction + test_fraction, else train",
            "unit": "cluster" if cfg.split == "time" else cfg.split,
            "splits": list(SPLITS),
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "seed": cfg.split_seed,
            "fixed": {
                f.split: {"key": KEYS[f.split], "sources": [i.path for i in held[f.split]]}
                for f in fixed
            },
            **_time(decided, written),
        },
        "weights": {
            "mode": cfg.weights,
            "meaning": "kept document weight = its cluster size"
            if cfg.weights == "preserve"
            else "every kept document weighs 1",
        },
        "budget": {"chars": decided["budget_chars"]},
        "counts": {
            "records_in": records_in,
            "kept": kept,
            "dropped": dropped,
            "quarantined": n_quarantined,
            "quarantined_by_reason": dict(sorted(quarantined.items())),
            "unread_bytes": unread_bytes,
            "duplicate_ids": duplicate_ids,
            "fixed": {f.split: f.records for f in fixed},
            "conservation": f"{records_in} = {kept} kept + {n_dropped} dropped "
            f"+ {n_quarantined} quarantined",
            "by_split": by_split,
            "by_split_domain": [
                {"split": s, "domain": d, "documents": n, "chars": chars[(s, d)]}
                for (s, d), n in sorted(
                    by_split_domain.items(), key=lambda kv: (SPLITS.index(kv[0][0]), kv[0][1])
                )
            ],
        },
        "sample_drops": samples,
        "files": files,
    }
