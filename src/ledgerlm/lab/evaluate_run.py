"""Scoring a run's snapshot after the fact (``ledgerlm eval``): its checkpoint's weights
on downstream tasks, in this process or with lm-evaluation-harness, written into the
ledger as an evaluation of that snapshot.

A run keeps one checkpoint, its latest (each save replaces the one before), so the
snapshot is the checkpoint's step; ``step`` names it, and another step is refused
naming the one there is. The tasks are the run's own ``eval.tasks`` (all of them, or
those named) or the ``[[tasks]]`` tables of a TOML file (``TaskConfig`` each); a file
task's path is read from the current directory, as a recipe's are, and a built-in task
is the one made from the run's data version (``lab.tasks.resolve_tasks``).

In process the tasks are scored as the run's evaluator scores them (``train.task_eval``:
the token version's tokenizer with BOS and EOS, ``pack.seq_len``, forwards of
``micro_batch_rows``), on this process's CPU, with the run's numerics (bf16 autocast
under ``train.precision = "bf16"``, as ``Trainer.autocast``). With ``harness`` the
snapshot is exported as a Hugging Face folder and lm-evaluation-harness scores the same
items (``lab.harness``), in float32 as its ``hf`` model loads it.

The result is an evaluation of the snapshot (its step, tokens, targets and updates from
the checkpoint, its weights digest) bound to a new phase of kind ``eval_after`` holding
the wall seconds of loading, scoring (and exporting), with ``snapshot_step``,
``harness``, ``task_seconds``, ``tasks`` and the task files (``lab.tasks.task_record``:
path, sha256, items) in its detail, and
this process's one device as its device time. Such an evaluation never confirms a
target nor breaks a streak, its phase is never on the bill (``ledger.target``), and the
time before it is no gap of the run (``ledger.coverage``); the run's status stays as it
was. Where the loop evaluated the same step, the checkpoint's digest must be the one it
recorded: the ledger then holds two scores of one snapshot. (An FSDP run's digests are
of its shards, ``train.snapshot``, and cannot be compared with one process's.)

A task of the run's name (one of its own, or a ``[[tasks]]`` table of that name) scores
under the run's metric keys, so its file must be the one the run started with: the
same sha256 and item count as its first ``tasks`` event (``lab.skeleton.unchanged_tasks``),
and a ``[[tasks]]`` table of that name must score it as the run's recipe does (kind,
few-shot draw, field names, delimiters, generation; only its path and limit may differ).
``limit`` only ever lowers a task's own limit.

Everything that can be refused is refused before anything is written: a live run, no
checkpoint, another step, unknown or no tasks, a task file that cannot be read or has
changed since the run started, a checkpoint that is not the loop's snapshot. The phase
is written only once the scores exist, with the seconds measured from the model's
loading on: a scoring that fails (the harness's error, Ctrl-C) leaves the ledger as it
was.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledgerlm.config import Recipe, TaskConfig, load_recipe, read_toml
from ledgerlm.errors import ArgumentError
from ledgerlm.extras import check
from ledgerlm.lab.continued import find_version
from ledgerlm.lab.export import load_run_model
from ledgerlm.lab.harness import run_harness
from ledgerlm.lab.skeleton import check_task_lengths, run_lock, unchanged_tasks
from ledgerlm.lab.status import interrupted
from ledgerlm.lab.tasks import builtin_config, resolve_tasks, task_record
from ledgerlm.ledger.store import Ledger, LedgerError, require_ledger
from ledgerlm.ledger.target import EVAL_AFTER
from ledgerlm.model.export import export_hf
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tasks.items import TaskSet
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.checkpoint import STATE, resolve_checkpoint
from ledgerlm.train.snapshot import weights_digest
from ledgerlm.train.task_eval import Tasks
from ledgerlm.workspace import Workspace, read_json

PURPOSE = "ledgerlm eval --harness"


@dataclass(frozen=True)
class AfterEval:
    """An evaluation written after the fact: what was scored, how, and where it is."""

    run_id: str
    step: int
    snapshot: str  # the weights digest of the checkpoint scored
    harness: bool
    metrics: dict[str, float]  # task/<name>/<metric> and their stderr, interval, items
    task_seconds: dict[str, float]
    tasks: list[str]
    seconds: float  # the eval_after phase's wall seconds
    evaluation_id: int
    phase_id: int
    loop_snapshot: bool | None  # the loop's digest at this step matched; None: none to check


class _TasksFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tasks: list[TaskConfig] = Field(min_length=1)


def read_tasks_file(path: Path) -> list[TaskConfig]:
    """The ``[[tasks]]`` tables of a TOML file, each a ``TaskConfig``; a bad file or
    table is one line naming the file and the key."""
    path = Path(path)
    tree = read_toml(path, "the tasks file")
    try:
        return list(_TasksFile.model_validate(tree).tasks)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(file)"
        if first["type"] == "extra_forbidden":
            raise ValueError(f"{path}: unknown key '{where}'") from None
        if first["type"] == "missing" and first["loc"] == ("tasks",):
            raise ValueError(f"{path}: no [[tasks]] tables") from None
        msg = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{path}: {where}: {msg}") from None


def chosen_tasks(recipe: Recipe, selectors: Sequence[str], run_id: str) -> list[TaskConfig]:
    """The tasks ``selectors`` name: each a TOML file of ``[[tasks]]`` (a path that is a
    file, or ends in ``.toml``) or the name of one of the run's ``eval.tasks``; none
    at all: every task of the run. Unknown names, a name given twice and no task at all
    are refused (``ArgumentError`` naming ``tasks``)."""
    own = {t.name: t for t in recipe.eval.tasks}
    if not selectors:
        if not own:
            raise ArgumentError(
                "run {run} has no eval.tasks: give a TOML file of [[tasks]] tables ({tasks})",
                run=run_id,
            )
        return list(own.values())
    out: list[TaskConfig] = []
    for selector in selectors:
        path = Path(selector)
        if path.is_file() or path.suffix == ".toml":
            for cfg in read_tasks_file(path):
                _scored_alike(cfg, own.get(cfg.name), path, run_id)
                out.append(cfg)
        elif selector in own:
            out.append(own[selector])
        else:
            have = ", ".join(own) or "none"
            raise ArgumentError(
                "{tasks} {name}: not a file, nor a task of run {run} (its eval.tasks: {have})",
                name=repr(selector),
                run=run_id,
                have=have,
            )
    names = [t.name for t in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ArgumentError("{tasks}: task {names} given more than once", names=", ".join(twice))
    return out


def _how_scored(cfg: TaskConfig) -> dict[str, Any]:
    """What decides a task's prompts and scores beyond its file and limit (which
    ``unchanged_tasks`` checks by the file's sha256 and the item count)."""
    if cfg.builtin is not None:
        cfg = builtin_config(cfg)
    kind = cfg.task_kind
    keys = ["builtin", "context_field", "split_field", "few_shot", "delimiter"]
    keys += ["seed", "fewshot_delimiter"] if cfg.few_shot else []
    keys += ["choices_field", "gold_field"] if kind == "choice" else ["answer_field"]
    keys += ["max_new_tokens", "stop"] if kind == "exact" else []
    return {"kind": kind} | {k: getattr(cfg, k) for k in keys}


def _scored_alike(cfg: TaskConfig, own: TaskConfig | None, path: Path, run_id: str) -> None:
    """A tasks file's table named as one of the run's tasks scores under the run's
    metric keys, so it must build the same prompts and score them the same way (kind,
    few-shot draw, field names, delimiters, generation); one line naming what differs."""
    if own is None:
        return
    mine, theirs = _how_scored(cfg), _how_scored(own)
    # another kind is the one difference worth naming: it scores other keys altogether
    differ = (
        ["kind"] if mine["kind"] != theirs["kind"] else [k for k in mine if mine[k] != theirs[k]]
    )
    if differ:
        shown = ", ".join(f"{k} = {mine[k]!r} (the run's: {theirs[k]!r})" for k in differ)
        raise ValueError(
            f"{path}: task {cfg.name!r} is one of run {run_id}'s tasks, scored under its "
            f"metric keys, but is not scored as the run scores it: {shown}; give it "
            "another name"
        )


def _checkpoint_state(workspace: Workspace, run_id: str, step: int | None) -> dict[str, Any]:
    folder = resolve_checkpoint(workspace.run_dir(run_id) / "checkpoint")
    if not (folder / STATE).is_file():
        raise LedgerError(f"run {run_id} has no checkpoint to evaluate")
    state = read_json(folder / STATE)
    if step is not None and int(step) != int(state["step"]):
        raise ArgumentError(
            "{step} {value}: run {run} keeps one checkpoint, its latest, at step {have}",
            value=step,
            run=run_id,
            have=state["step"],
        )
    return state


def _loop_snapshots(summary: dict[str, Any], step: int) -> set[str]:
    """The digests the run itself recorded at ``step`` (not after the fact)."""
    after = {p["id"] for p in summary["phases"] if p["kind"] == EVAL_AFTER}
    return {
        e["snapshot"]
        for e in summary["evaluations"]
        if e["step"] == step and e.get("phase_id") not in after and e.get("snapshot")
    }


def _sharded(state: dict[str, Any]) -> bool:
    return state.get("format") == "dcp" and int(state.get("ranks", 1)) > 1


def evaluate_run(
    workspace: Workspace,
    run_ref: str,
    *,
    step: int | None = None,
    tasks: Sequence[str] = (),
    harness: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
) -> AfterEval:
    """Score run ``run_ref``'s checkpoint on downstream tasks and record it (module doc).

    ``tasks``: TOML files and names of the run's tasks (``chosen_tasks``); ``limit``
    scores at most the first N items of each (never more than its own ``limit``);
    ``harness`` scores with lm-evaluation-harness (the ``lmeval`` extra) instead of in
    process."""
    progress = progress or NullProgress()
    if limit is not None and limit < 1:
        raise ArgumentError("{limit} {value}: must be at least 1", value=limit)
    if harness:  # before anything is read or written
        check("lm_eval", PURPOSE)
        check("transformers", PURPOSE)
    require_ledger(workspace.ledger_path)
    with Ledger(workspace.ledger_path, read_only=True) as reader:  # refusals write nothing
        run_id = reader.resolve_run(run_ref)
        before = reader.run_summary(run_id)
    run = before["run"]
    _refuse_live(workspace, run)
    at = int(_checkpoint_state(workspace, run_id, step)["step"])
    recipe = load_recipe(workspace.run_dir(run_id) / "recipe.toml")
    cfgs = chosen_tasks(recipe, tasks, run_id)
    if limit is not None:  # only ever fewer items than the task's own limit
        cfgs = [c.model_copy(update={"limit": min(limit, c.limit or limit)}) for c in cfgs]
    store = TokenStore(find_version(workspace, "tokens", run["tokens_version"], verify=False).path)
    sets = resolve_tasks(cfgs, workspace, store, None)
    # every continuation fits the model's context, as a run checks before training
    check_task_lengths(sets, store.tokenizer, recipe.pack.seq_len)
    # a task of the run's name scores under its metric keys: the same file, or refused
    unchanged_tasks(before, sets, limit)
    names = [t.name for t in sets]
    files = [task_record(t) for t in sets]
    with Ledger(workspace.ledger_path) as ledger, _held(workspace, ledger, run_id):
        # under the run's lock: the checkpoint is still the one found above
        state = _checkpoint_state(workspace, run_id, at)
        summary = ledger.run_summary(run_id)
        start = time.perf_counter()
        loaded = load_run_model(workspace, run_id, purpose="evaluate")
        model = loaded.model.eval()
        digest = weights_digest(model)
        recorded = _loop_snapshots(summary, at)
        if recorded and not _sharded(state) and digest not in recorded:
            raise LedgerError(
                f"run {run_id}: the checkpoint's weights (digest {digest}) are not the "
                f"snapshot the run evaluated at step {at} ({', '.join(sorted(recorded))})"
            )
        if harness:
            metrics, seconds = _by_harness(loaded, sets, workspace, progress)
        else:
            metrics, seconds = _in_process(loaded.recipe, store, sets, model, progress)
        # The phase is written once the scores exist, with the seconds they took: an
        # attempt that failed or was interrupted leaves nothing in the ledger.
        took = time.perf_counter() - start
        detail = {
            "snapshot_step": at,
            "harness": harness,
            "tasks": names,
            "task_seconds": seconds,
            "task_files": files,
            "snapshot": digest,
            "device": "cpu",
            # this process held one device (the CPU), whatever the run trained on
            "device_seconds": took,
        }
        counters = state.get("counters") or {}
        with ledger.together():  # the phase and its evaluation, or neither
            phase_id = ledger.record_phase(
                run_id, EVAL_AFTER, took, step_start=at, step_end=at, detail=detail
            )
            evaluation_id = ledger.add_evaluation(
                run_id,
                step=at,
                tokens=int(counters.get("tokens", 0)),
                targets=int(counters.get("supervised_targets", 0)),
                updates=int(counters.get("optimizer_updates", at)),
                metrics=metrics,
                snapshot=digest,
                phase_id=phase_id,
                consumed={
                    k.removeprefix("tokens/"): int(v)
                    for k, v in counters.items()
                    if k.startswith("tokens/")
                },
            )
    checked = None if not recorded or _sharded(state) else True
    return AfterEval(
        run_id=run_id,
        step=at,
        snapshot=digest,
        harness=harness,
        metrics=metrics,
        task_seconds=seconds,
        tasks=names,
        seconds=took,
        evaluation_id=evaluation_id,
        phase_id=phase_id,
        loop_snapshot=checked,
    )


def _refuse_live(workspace: Workspace, run: dict[str, Any]) -> None:
    """A run that a live process trains is refused in one line."""
    if run["status"] == "running" and not interrupted(workspace, run):
        raise LedgerError(f"run {run['id']} is being trained: evaluate it once it has ended")


@contextmanager
def _held(workspace: Workspace, ledger: Ledger, run_id: str) -> Iterator[None]:
    """The run's lock held for the length of the block, so no process trains it
    meanwhile (one that started since it was last looked at is refused)."""
    _refuse_live(workspace, ledger.run_summary(run_id)["run"])
    with ExitStack() as stack:
        try:
            stack.enter_context(run_lock(workspace.run_dir(run_id)))
        except LedgerError:
            raise LedgerError(
                f"run {run_id} is being trained: evaluate it once it has ended"
            ) from None
        yield


def _in_process(
    recipe: Recipe,
    store: TokenStore,
    sets: Sequence[TaskSet],
    model: torch.nn.Module,
    progress: Progress,
) -> tuple[dict[str, float], dict[str, float]]:
    """The tasks scored as the run's evaluator scores them (``lab.build.run_tasks``: the
    token version's tokenizer, BOS and EOS, ``pack.seq_len``, ``micro_batch_rows`` rows a
    forward), on this process's CPU; ``run_tasks`` itself gives nothing for a recipe
    without tasks of its own, which a tasks file may score."""
    special = store.special
    scorer = Tasks(
        tuple(sets),
        store.tokenizer,
        special.get("bos"),
        special.get("eos"),
        recipe.pack.seq_len,
        recipe.train.micro_batch_rows,
    )
    bf16 = recipe.train.precision == "bf16"
    metrics: dict[str, float] = {}
    seconds: dict[str, float] = {}
    with progress.task("scoring tasks", total=len(sets)) as bar:
        for task in sets:
            one = dataclasses.replace(scorer, sets=(task,))
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                got, took = one.score(model, None)
            metrics.update(got)
            seconds.update(took)
            bar.advance(1, info=task.name)
    return metrics, seconds


def _by_harness(
    loaded: Any, sets: Sequence[TaskSet], workspace: Workspace, progress: Progress
) -> tuple[dict[str, float], dict[str, float]]:
    """The snapshot exported into a temporary folder and scored by lm-evaluation-harness."""
    recipe = loaded.recipe
    with tempfile.TemporaryDirectory(prefix="ledgerlm-eval-") as tmp:
        folder = export_hf(
            loaded.model,
            Path(tmp) / "model",
            tokenizer_path=workspace.version_dir("tokens", loaded.tokens_version)
            / "tokenizer.json",
            special=loaded.tokenizer["special"],
            max_positions=recipe.pack.seq_len,
        )
        results = run_harness(
            folder,
            sets,
            Path(tmp) / "work",
            seq_len=recipe.pack.seq_len,
            rows=recipe.train.micro_batch_rows,
            progress=progress,
        )
    metrics = {k: v for r in results for k, v in r.metrics.items()}
    return metrics, {r.name: round(r.seconds, 6) for r in results}
