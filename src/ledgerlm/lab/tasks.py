"""A recipe's ``[[eval.tasks]]`` as the task sets a run scores.

A task file is read where the user named it: a relative path from the current
directory, as ``data.sources`` are. A built-in task is made from the data version's
held-out material (``data.builtin_tasks``) once per data version and written as a real
JSONL file into the workspace, ``tasks/<data version>/<task>.jsonl``, so that every run
on that version, and ``ledgerlm eval --harness``, scores the very same file. Beside it,
``<task>.json`` records what made it: the rules' format, the data version, the file's
sha256, its record counts and the contamination check. The JSONL is written first and
the record last (both atomically), so a record names a finished file; a file whose
record is missing, from other rules or another version, or whose bytes differ from the
sha256 it gives, is made again (it is a pure function of the data version).

Before a built-in file is written its scored items are checked against the training
split with the contamination pass's n-grams; an item that overlaps is dropped, and the
count is in the record (``task_record`` gives it to the run).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledgerlm.config import TaskConfig
from ledgerlm.data import builtin_tasks
from ledgerlm.tasks.items import TaskSet, load_task
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.workspace import (
    MANIFEST,
    DamagedVersion,
    Workspace,
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    read_manifest,
)

# A built-in task's own delimiters, whatever the recipe's defaults say (a recipe read
# back from the ledger names every field, so "left unset" cannot be told apart from
# "set to the default"): arith's lines follow each other one per line in the math
# documents; code-next-line's context ends with a newline, so the continuation is the
# whole next line as the file has it, with nothing between.
BUILTIN_SETTINGS: dict[str, dict[str, str]] = {
    "arith": {"delimiter": " ", "fewshot_delimiter": "\n"},
    "code-next-line": {"delimiter": "", "fewshot_delimiter": "\n"},
}
_FIELDS = ("context_field", "choices_field", "gold_field", "answer_field", "split_field")


def resolve_tasks(
    cfgs: Sequence[TaskConfig], ws: Workspace, store: TokenStore, data_dir: Path | None
) -> list[TaskSet]:
    """The task sets of ``cfgs``, in recipe order. ``data_dir`` is the data version the
    tokens were made from (None: the one ``store`` names, looked up in ``ws``); only
    built-in tasks read it. Bad input is a ``ValueError`` of one line."""
    out = []
    for cfg in cfgs:
        if cfg.builtin is None:
            out.append(load_task(cfg, Path(str(cfg.path))))
            continue
        own = builtin_config(cfg)
        folder = data_dir if data_dir is not None else _data_of(ws, store, cfg)
        out.append(load_task(own, materialize(str(cfg.builtin), ws, folder)))
    return out


def builtin_config(cfg: TaskConfig) -> TaskConfig:
    """``cfg`` with the built-in task's own delimiters. Its records' field names and
    delimiters are the task's: a recipe that sets others is refused, not ignored."""
    own = BUILTIN_SETTINGS[str(cfg.builtin)]
    fields = TaskConfig.model_fields
    changed = [f for f in _FIELDS if getattr(cfg, f) != fields[f].default]
    changed += [f for f, v in own.items() if getattr(cfg, f) not in (v, fields[f].default)]
    if changed:
        raise ValueError(
            f"task {cfg.name!r}: the built-in task {cfg.builtin} has its own "
            f"{', '.join(changed)}; leave them unset"
        )
    return cfg.model_copy(update=own)


def _data_of(ws: Workspace, store: TokenStore, cfg: TaskConfig) -> Path:
    version = store.manifest.get("data_version")
    if not isinstance(version, str) or not ws.has_version("data", version):
        raise ValueError(
            f"task {cfg.name!r}: the built-in task {cfg.builtin} is made from the data "
            f"version of tokens {store.path.name}, which is not in {ws.root} "
            f"(`ledgerlm data prepare RECIPE` builds it)"
        )
    return ws.version_dir("data", version)


def task_file(ws: Workspace, data_version: str, builtin: str) -> Path:
    """Where a built-in task's JSONL lives for a data version."""
    return ws.root / "tasks" / data_version / f"{builtin}.jsonl"


def _record_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _reusable(path: Path, data_version: str) -> bool:
    """The file is there, made by these rules from this data version, and intact."""
    record = _record_path(path)
    if not (path.is_file() and record.is_file()):
        return False
    try:
        made = read_manifest(record)
    except DamagedVersion:
        return False
    return (
        made.get("format") == builtin_tasks.TASKS_FORMAT
        and made.get("data_version") == data_version
        and made.get("sha256") == file_sha256(path)
    )


def materialize(builtin: str, ws: Workspace, data_dir: Path) -> Path:
    """The built-in task's JSONL for the data version in ``data_dir``: reused when its
    record vouches for it, else made, checked for contamination and written."""
    manifest = read_manifest(data_dir / MANIFEST)
    version = str(manifest.get("version") or data_dir.name)
    path = task_file(ws, version, builtin)
    if _reusable(path, version):
        return path
    if builtin == "arith":
        records = builtin_tasks.arith_records()
    else:
        functions = builtin_tasks.held_out_functions(data_dir, manifest)
        records = builtin_tasks.code_next_line_records(functions)
    scored = [r for r in records if r.get("split") != "train"]
    ngram = manifest.get("config", {}).get("contamination", {}).get("ngram", 13)
    texts = [builtin_tasks.scored_text(r) for r in scored]
    hit, report = builtin_tasks.overlapping(texts, data_dir, manifest, ngram)
    kept = [r for r in records if r.get("split") == "train"]
    kept += [r for r, bad in zip(scored, hit.tolist(), strict=True) if not bad]
    if len(kept) == len(records) - len(scored):
        raise ValueError(
            f"built-in task {builtin}: data version {version} leaves no item to score "
            f"({len(scored)} made, {report['contaminated']} overlap the training split)"
        )
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    atomic_write_json(
        _record_path(path),
        {
            "format": builtin_tasks.TASKS_FORMAT,
            "task": builtin,
            "data_version": version,
            "sha256": file_sha256(path),
            "pool": len(records) - len(scored),
            "made": len(scored),
            "scored": len(kept) - (len(records) - len(scored)),
            "contamination": {**report, "dropped": report["contaminated"]},
        },
    )
    return path


def task_record(task: TaskSet) -> dict[str, Any]:
    """What a run records of a task: its file, the file's sha256 and the items scored;
    for a built-in task also the data version and the contamination check (how many
    items were dropped for overlapping the training split)."""
    out: dict[str, Any] = {
        "name": task.name,
        "kind": task.kind,
        "path": str(task.path),
        "sha256": task.digest,
        "items": len(task.items),
    }
    if task.cfg.builtin is not None:
        made = read_manifest(_record_path(task.path))
        out.update(
            builtin=task.cfg.builtin,
            data_version=made.get("data_version"),
            contamination=made.get("contamination"),
        )
    return out
