"""Held-out splits fixed by the user (``[eval] sources`` and ``test_sources``, requirement T1).

A fixed validation or test set is read as given: it is not filtered, deduplicated or
split, so the set a target is confirmed on is exactly the one the user named. Its
documents are written as the version's ``val`` (or ``test``) shards, and the split no
longer draws from the training sources. Every fixed set is also an evaluation set of
the contamination check, so training documents that share an n-gram (or an LSH band)
with it are counted, and dropped with ``data.contamination.drop``.

A record of a fixed set that cannot be read stops the build with its file, line and
reason: a held-out set with holes would no longer be the set that was fixed. Memory:
the set's texts while its n-grams are computed (held-out sets are small next to the
training corpus); documents are written in batches of ``shard_docs``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ledgerlm.config import DataConfig, InputConfig
from ledgerlm.data.contamination import EvalSet, eval_set
from ledgerlm.data.passes import OUTPUT_SCHEMA, doc_row
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined, ReaderError
from ledgerlm.data.records import Document

# the recipe key that fixes each split, for messages and contamination reports
KEYS = {"val": "eval.sources", "test": "eval.test_sources"}


class HeldOutError(ValueError):
    """A fixed held-out set that cannot be read whole, or holds no document."""


@dataclass
class FixedSplit:
    split: str
    files: list[dict[str, Any]] = field(default_factory=list)
    by_domain: Counter[str] = field(default_factory=Counter)
    chars: Counter[str] = field(default_factory=Counter)
    records: int = 0
    evalset: EvalSet | None = None


def file_name(split: str, part: int) -> str:
    return f"{split}-fixed-{part:05d}.parquet"


def write_fixed(cfg: DataConfig, base: Path, out: Path) -> list[FixedSplit]:
    """Read every fixed held-out set of ``cfg`` and write it as its split's shards."""
    done = []
    for split, inputs in cfg.held_out_inputs().items():
        done.append(_write_split(cfg, split, inputs, base, out))
    return done


def _documents(cfg: DataConfig, split: str, inputs: list[InputConfig], base: Path):
    try:
        shards = expand_inputs(inputs, base)
        for shard in shards:
            for item in read_shard(shard, cfg.builtin):
                if isinstance(item, Quarantined):
                    where = f"{item.file}:{item.line}" if item.line is not None else item.file
                    raise HeldOutError(
                        f"{where}: {item.reason} ({KEYS[split]} is read whole: fix the record "
                        "or remove it from the file)"
                    )
                yield item
    except ReaderError as err:
        raise HeldOutError(f"{KEYS[split]}: {err}") from None


def _write_split(
    cfg: DataConfig, split: str, inputs: list[InputConfig], base: Path, out: Path
) -> FixedSplit:
    fixed = FixedSplit(split)
    texts: list[str] = []
    batch: list[Document] = []

    def flush() -> None:
        path = out / file_name(split, len(fixed.files))
        table = pa.Table.from_pylist([doc_row(d, 1.0, d.id, 1) for d in batch], OUTPUT_SCHEMA)
        pq.write_table(table, path, compression="zstd")
        fixed.files.append({"path": path.name, "split": split, "rows": len(batch)})
        batch.clear()

    for doc in _documents(cfg, split, inputs, base):
        fixed.records += 1
        fixed.by_domain[doc.domain] += 1
        fixed.chars[doc.domain] += len(doc.text)
        texts.append(doc.text)
        batch.append(doc)
        if len(batch) >= cfg.shard_docs:
            flush()
    if batch:
        flush()
    if not fixed.records:
        paths = ", ".join(i.path for i in inputs)
        raise HeldOutError(f"{KEYS[split]} ({paths}) holds no document")
    near = cfg.near_dedup if cfg.near_dedup.enabled else None
    fixed.evalset = eval_set(KEYS[split], texts, cfg.contamination, near)
    return fixed
