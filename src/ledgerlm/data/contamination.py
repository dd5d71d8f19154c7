"""Train/eval contamination beyond whole-line hashes (D7).

Each evaluation file is reduced to the set of its word n-gram hashes (13-grams
by default; an example shorter than n words counts as one n-gram) and its
MinHash band keys. Training documents are checked shard by shard against the
union of those n-grams; an evaluation example is contaminated when one of its
n-grams occurs in training text, or when it shares an LSH band with a training
document (a near duplicate). Memory: the evaluation n-grams only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.config import BuiltinCorpusConfig, ContaminationConfig, InputConfig, NearDedupConfig
from ledgerlm.data.minhash import band_keys, minhash_flat, params_from_config
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined
from ledgerlm.data.shingles import shingle_batch


@dataclass
class EvalSet:
    name: str
    doc_ngrams: list[np.ndarray]
    all_ngrams: np.ndarray  # sorted, unique
    bands: np.ndarray | None = None  # (documents, bands) LSH keys
    quarantined: int = 0


def load_eval_sets(
    cfg: ContaminationConfig,
    base: Path,
    builtin: BuiltinCorpusConfig,
    near: NearDedupConfig | None = None,
) -> list[EvalSet]:
    out = []
    for name in cfg.eval_files:
        texts, bad = [], 0
        for shard in expand_inputs([InputConfig(path=name)], base):
            for item in read_shard(shard, builtin):
                if isinstance(item, Quarantined):
                    bad += 1
                else:
                    texts.append(item.text)
        out.append(eval_set(name, texts, cfg, near, bad))
    return out


def eval_set(
    name: str,
    texts: list[str],
    cfg: ContaminationConfig,
    near: NearDedupConfig | None = None,
    quarantined: int = 0,
) -> EvalSet:
    """The n-grams of every example (and its LSH band keys when ``near`` is enabled)."""
    grams = shingle_batch(texts, cfg.ngram).sets()
    union = np.unique(np.concatenate(grams)) if grams else np.zeros(0, np.uint64)
    bands = None
    if near is not None and near.enabled and texts:
        params = params_from_config(near)
        batch = shingle_batch(texts, params.shingle_words)
        bands = band_keys(minhash_flat(batch.hashes, batch.offsets, params), params)
    return EvalSet(name, grams, union, bands, quarantined)


def near_hits(evals: list[EvalSet], train_bands: np.ndarray) -> list[np.ndarray]:
    """Per eval set, a boolean per example: shares an LSH band with a training document."""
    hits = []
    for e in evals:
        if e.bands is None or not len(train_bands):
            hits.append(np.zeros(len(e.doc_ngrams), dtype=bool))
            continue
        same_band = np.zeros(len(e.doc_ngrams), dtype=bool)
        for b in range(e.bands.shape[1]):
            same_band |= np.isin(e.bands[:, b], train_bands[:, b])
        hits.append(same_band)
    return hits


def contamination_report(
    evals: list[EvalSet], matched: np.ndarray, near: list[np.ndarray] | None = None
) -> dict[str, Any]:
    """Contaminated share of every evaluation file, by n-gram overlap and near duplicates."""
    files = []
    for i, e in enumerate(evals):
        by_ngram = np.array([np.isin(g, matched).any() for g in e.doc_ngrams], dtype=bool)
        by_near = near[i] if near is not None else np.zeros_like(by_ngram)
        either = by_ngram | by_near
        n = len(e.doc_ngrams)
        files.append(
            {
                "eval_file": e.name,
                "examples": n,
                "quarantined": e.quarantined,
                "ngram_overlap": int(by_ngram.sum()),
                "near_duplicate": int(by_near.sum()),
                "contaminated": int(either.sum()),
                "contaminated_fraction": float(either.mean()) if n else 0.0,
            }
        )
    return {"files": files}


def contamination_warnings(manifest: dict[str, Any]) -> list[str]:
    """One line per fixed held-out set that shares text with the training split."""
    report = next(s for s in manifest["steps"] if s["name"] == "contamination")
    fixed = {v["key"] for v in manifest["split"].get("fixed", {}).values()}
    return [
        f"{f['contaminated']}/{f['examples']} examples of {f['eval_file']} overlap the "
        f"training text ({report.get('ngram')}-gram or near duplicate); "
        + (
            "the overlapping training documents were dropped"
            if report.get("drop")
            else "set data.contamination.drop = true to drop them from training"
        )
        for f in report["files"]
        if f["eval_file"] in fixed and f["contaminated"]
    ]
