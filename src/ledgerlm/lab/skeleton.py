"""The skeleton every run shares, fresh or resumed, on rank 0 or another rank.

The prologue (``prologue``: rank 0 leads, other ranks follow), the ``Handoff`` and
its one message (``handoff_message``), the guards a run trains under (``run_lock``,
``failing``, ``checkpointed_if_locked``), the checks on the recipe, the versions and
evaluation sets built as phases, and training to the end (``train_run``: the final
checkpoint and the test scores). ``lab.run`` starts runs and follows rank 0
on the other ranks; ``lab.resume`` resumes them.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ledgerlm.config import Recipe
from ledgerlm.data.contamination import contamination_warnings
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.lab.build import Parts, build_trainer, test_set, val_batches
from ledgerlm.lab.continued import InitSource
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.signals import received, signal_name, undisturbed
from ledgerlm.lab.tasks import resolve_tasks, task_record
from ledgerlm.ledger import events
from ledgerlm.ledger.store import LedgerBusyError, LedgerError
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tasks.encoding import encode_pair
from ledgerlm.tasks.items import TaskSet, load_task
from ledgerlm.tasks.score import no_tokens_of_its_own
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.checkpointing import checkpointer
from ledgerlm.train.distributed import World, one_process
from ledgerlm.train.evaluate import EvalCallback, unigram_entropy
from ledgerlm.train.loop import Trainer
from ledgerlm.train.task_eval import check_sharded
from ledgerlm.workspace import BuiltVersion, Workspace


class Handoff:
    """Rank 0 tells the other ranks what to train (versions, checkpoint, earlier
    evaluations) once it is ready, or that it failed, so no rank waits forever."""

    def __init__(self, world: World) -> None:
        self.world, self.sent = world, False

    def send(self, message: dict[str, Any] | None) -> None:
        if self.world.distributed and not self.sent:
            self.sent = True
            self.world.broadcast_object(message)

    @contextmanager
    def guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.send(None)
            raise


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One process trains a run at a time; the kernel drops the lock when it dies."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LedgerError(f"run {run_dir.name} is being trained by another process") from None
        yield


@contextmanager
def failing(recorder: LedgerRecorder) -> Iterator[None]:
    """Any error writes the updates still buffered, closes the open phase, records an
    ``error`` event and marks the run failed; an interrupt (Ctrl-C, SIGTERM, SIGHUP:
    ``lab/signals.py``) does the same with an ``interrupted`` event naming the signal.
    However the run ends, its sinks are closed (flushed, with the run's status); a
    second signal does not cut that short. When the error is the ledger's and the
    ledger cannot take that either, the error says so (``ledger list`` then calls the
    run interrupted)."""
    try:
        yield
    except BaseException as exc:
        with undisturbed():
            try:
                recorder.flush()
                recorder.stop()
                stop = exc if isinstance(exc, KeyboardInterrupt) else received()
                if stop is not None:  # the error, if another, came of the signal
                    recorder.event(events.INTERRUPTED, signal_name(stop))
                else:
                    recorder.event(events.ERROR, f"{type(exc).__name__}: {exc}")
                recorder.ledger.finish_run(recorder.run_id, "failed")
            except LedgerError as again:
                if not isinstance(exc, LedgerError):
                    raise
                also = "" if str(again) == str(exc) else f" ({again})"
                raise type(exc)(f"{exc}; nor could the run be marked failed{also}") from None
        raise
    finally:
        with undisturbed():
            recorder.close()


def check_contract(recipe: Recipe, world: World) -> None:
    """What the recipe asks of this world that it cannot give, and the task files it
    names, each refused in one line before anything is written."""
    if recipe.train.optimizer == "muon" and world.sharded:
        raise ValueError(
            "train.optimizer = 'muon' orthogonalizes whole matrices, which FSDP shards; "
            "use train.parallel = 'ddp' with muon"
        )
    check_sharded(recipe.eval.tasks, world)
    check_task_files(recipe)


def check_task_files(recipe: Recipe) -> None:
    """Every task file the recipe names is read and checked (``tasks.items.load_task``:
    a missing file or a bad record is ``file:line: reason``), and every exact task must
    leave its context room in ``pack.seq_len`` beside the tokens it generates, so a bad
    one stops the run before its ledger row; the run reads them again as it starts
    (``eval_sets``, which checks their lengths in tokens). Built-in tasks are made from
    the data version, which only the run has."""
    seq_len = recipe.pack.seq_len
    for cfg in recipe.eval.tasks:
        if cfg.task_kind == "exact" and cfg.max_new_tokens >= seq_len:
            raise ValueError(
                f"eval.tasks {cfg.name!r}: max_new_tokens {cfg.max_new_tokens} leaves no "
                f"room for a context in pack.seq_len {seq_len}"
            )
        if cfg.path is not None:
            load_task(cfg, Path(cfg.path))


def check_task_lengths(tasks: Sequence[TaskSet], tokenizer: Tokenizer, seq_len: int) -> None:
    """Every continuation a likelihood task scores (choice, bpb) fits ``seq_len`` tokens
    as the scorer cuts it (``tasks.encoding.encode_pair``) and has at least one token of
    its own (``tasks.score.no_tokens_of_its_own``); the scorer would refuse either only
    at the first evaluation, after training began (and under ``torchrun`` on the one
    rank holding the item, the others waiting for it). One line naming the file and the
    record's line."""
    for task in tasks:
        if task.kind == "exact":
            continue
        for item in task.items:
            for j, continuation in enumerate(item.continuations):
                _, tokens = encode_pair(tokenizer, item.context, continuation)
                if not tokens:
                    raise ValueError(f"{task.path}:{item.line}: {no_tokens_of_its_own(item, j)}")
                if len(tokens) > seq_len:
                    raise ValueError(
                        f"{task.path}:{item.line}: a continuation of {len(tokens)} tokens "
                        f"does not fit pack.seq_len {seq_len}"
                    )


def check_metric(recipe: Recipe, store: TokenStore) -> None:
    """The metric and the per-domain targets name domains the token version has."""
    metric = recipe.eval.metric
    if metric.startswith("loss/") and metric.split("/", 1)[1] not in store.domains:
        raise ValueError(
            f"eval.metric = {metric!r}: the token version has no such domain "
            f"(domains: {', '.join(store.domains)})"
        )
    domains = {k for k in recipe.eval.targets if "/" not in k}  # task/... keys: config's
    unknown = sorted(domains - set(store.domains))
    if unknown:
        raise ValueError(
            f"eval.targets names domain(s) {', '.join(unknown)} that the token version does "
            f"not have (domains: {', '.join(store.domains)})"
        )


@dataclass
class EvalSets:
    """The fixed validation set (its unigram entropy), the test set and the downstream
    tasks' items."""

    val: list[Batch]
    entropy: float
    test: list[Batch]
    tasks: list[TaskSet]


def eval_sets(
    recorder: LedgerRecorder,
    store: TokenStore,
    recipe: Recipe,
    workspace: Workspace,
    data_dir: Path | None,
    tasks: list[TaskSet] | None = None,
) -> EvalSets:
    """Build the validation and test batches and resolve the recipe's tasks (built-in
    ones from the data version in ``data_dir``) as an ``eval`` phase. The ``tasks``
    event names each task's kind, file, sha256 and item count (``lab.tasks.task_record``;
    a built-in task's contamination check too): what the run scores,
    fixed as it starts (a resume resolves them again, checked against the first such
    event by ``unchanged_tasks``, and records them again; it passes them as ``tasks``).
    A task file that cannot be read, or an item too long for ``pack.seq_len``
    (``check_task_lengths``), is one line here, before training."""
    recorder.start("eval", what="build validation set")
    val = val_batches(store, recipe)
    test = test_set(store, recipe)
    if tasks is None:
        tasks = resolve_tasks(recipe.eval.tasks, workspace, store, data_dir)
    check_task_lengths(tasks, store.tokenizer, recipe.pack.seq_len)
    if tasks:
        recorder.event(events.TASKS, json.dumps([task_record(t) for t in tasks]))
    return EvalSets(val, unigram_entropy(val), test, tasks)


def unchanged_tasks(
    summary: dict[str, Any], sets: Sequence[TaskSet], limit: int | None = None
) -> None:
    """Each task of ``sets`` that the run scored as it started (its first ``tasks``
    event) must be the very file it scored then, read the same way: the same sha256 and
    as many items (at most ``limit``, when given; a table of a tasks file with a lower
    limit of its own, or another split field, would give others). A file changed since
    would score other items under the run's own metric keys; it is refused in one line
    naming it, before anything is written. Tasks of other names, and a run that
    recorded none, are not checked."""
    first = next((e for e in summary["events"] if e["kind"] == events.TASKS), None)
    if first is None:
        return
    run_id = summary["run"]["id"]
    then = {t["name"]: t for t in json.loads(first["message"])}
    for task in sets:
        was = then.get(task.name)
        if was is None:
            continue
        if was["sha256"] != task.digest:
            raise ValueError(
                f"{task.path}: changed since run {run_id} started (sha256 "
                f"{was['sha256'][:12]}... then, {task.digest[:12]}... now)"
            )
        want = int(was["items"]) if limit is None else min(limit, int(was["items"]))
        if len(task.items) != want:
            raise ValueError(
                f"{task.path}: task {task.name!r} gives {len(task.items)} items, where "
                f"run {run_id} scored {want} of the same file under its metric keys"
            )


def train_run(
    recorder: LedgerRecorder,
    recipe: Recipe,
    parts: Parts,
    evaluator: EvalCallback,
    world: World,
    *,
    started_at: float,
    progress: Progress,
    checkpoints: tuple[Path, dict[str, Any]],
    test: list[Batch],
    resumed: dict[str, Any] | None = None,
    more: Sequence[Any] = (),
    before: tuple[float, float] = (0.0, 0.0),
) -> Trainer:
    """Build the trainer (a ``setup`` phase), train to max_steps, the target or the
    budget; then the final checkpoint, the test scores, and the run's status
    (reached or not). ``resumed`` is the trainer state of the checkpoint resumed from;
    ``before`` the (wall, device) seconds the ledger charged the run before this process."""
    recorder.start("setup", what="trainer")
    with progress.task("train", total=recipe.train.max_steps) as task:
        trainer = build_trainer(
            recipe,
            parts,
            evaluator,
            world,
            started_at=started_at,
            recorder=recorder,
            task=task,
            checkpoints=checkpoints,
            resumed=resumed,
            more=more,
            before=before,
        )
        with checkpointed_if_locked(recorder, trainer):
            trainer.fit()
    with checkpointed_if_locked(recorder, trainer):
        close_training(trainer, evaluator, test)
        reached = evaluator.reached_step is not None
        status = "reached" if reached else trainer.state.stop_status or "not reached"
        recorder.ledger.finish_run(recorder.run_id, status)
    return trainer


@contextmanager
def checkpointed_if_locked(recorder: LedgerRecorder, trainer: Trainer) -> Iterator[None]:
    """A ledger another process held past ``log.ledger_timeout`` stops the run, but only
    once it is checkpointed where it stands (the updates the ledger has not taken and
    an evaluation owed at that step go in the checkpoint), so ``ledgerlm resume``
    continues it; ``failing`` then marks it failed. A sharded run, which every rank
    checkpoints together, stops at its last checkpoint. The checkpoint is written by
    the trainer's checkpoint callback, as every checkpoint of the run is."""
    try:
        yield
    except LedgerBusyError as exc:
        if trainer.world.sharded:
            raise
        step = trainer.state.step
        rows = recorder.unwritten(trainer)
        kept = {"unwritten_steps": rows} if rows else {}
        checkpointer(trainer).write(trainer, **kept)
        raise LedgerBusyError(
            f"{exc}, past log.ledger_timeout = {recorder.ledger.patience:g} s: the run is "
            f"checkpointed at step {step} (ledgerlm resume {recorder.run_id} continues it)"
        ) from None


TEST_WHAT = {"confirming": "test set, confirming snapshot", "final": "test set, final weights"}


def close_training(trainer: Trainer, evaluator: EvalCallback, test: list[Batch]) -> None:
    """The final checkpoint, written by the trainer's checkpoint callback as the periodic
    ones are, and the test scores of the held-out split (``data.test_fraction``) by its
    evaluator, each a phase of the trainer's recorder: the snapshot that confirmed the
    target, and the final weights when they differ (``EvalCallback.test_snapshots``),
    each an ``eval`` phase of its own with its ``test_evaluation`` event. Rank 0 does
    it; with a sharded model every rank does (both gather the weights from all ranks).

    The test set never decides anything during the run (the target is confirmed on
    the validation set, which tuning also uses); it gives the final figure, after the
    target, so its phases are never on the time-to-target bill.
    """
    state, recorder = trainer.state, trainer.recorder
    recorder.start("checkpoint", state.step)
    recorder.counters(state.counters())
    recorder.event(events.TRAIN_END, state.stop_reason, step=state.step)
    checkpointer(trainer).write(trainer)
    if test:
        for snapshot in evaluator.test_snapshots(trainer):
            recorder.start("eval", state.step, what=TEST_WHAT[snapshot["role"]])
            record = evaluator.score_test(trainer, test, snapshot)
            recorder.event(events.TEST_EVALUATION, json.dumps(record), step=state.step)
    recorder.stop()


def prepare_versions(
    recorder: LedgerRecorder,
    recipe: Recipe,
    workspace: Workspace,
    progress: Progress,
    verify: bool = True,
) -> tuple[BuiltVersion, BuiltVersion, TokenStore]:
    """The data and tokens versions (built, or reused once checked against their
    manifests: content hashes too unless not ``verify``), as ``prep`` and ``tokenize``;
    what the checks found is the ``versions_verified`` event."""
    ph = recorder.start("prep")
    data = prepare_data(recipe.data_stage(), workspace, progress, verify=verify)
    ph.detail.update(
        version=data.version,
        reused=data.reused,
        built_seconds=data.build_seconds,
        verified=data.verified,
    )
    for line in contamination_warnings(data.manifest):
        recorder.event(events.CONTAMINATION, line)
    ph = recorder.start("tokenize")
    tokens = build_tokens(data, recipe.tokenizer, workspace, progress, verify=verify)
    ph.detail.update(
        version=tokens.version,
        reused=tokens.reused,
        built_seconds=tokens.build_seconds,
        verified=tokens.verified,
    )
    recorder.ledger.set_versions(
        recorder.run_id, data_version=data.version, tokens_version=tokens.version
    )
    record_verified(recorder, data, tokens)
    store = TokenStore(tokens.path)
    check_metric(recipe, store)
    return data, tokens, store


def record_verified(recorder: LedgerRecorder, *versions: BuiltVersion) -> None:
    """The ``versions_verified`` event: per version, whether it was reused and what
    checking it found (files, bytes, the hash, the largest token id) and cost (a version
    this run built was hashed as it was published)."""
    found = {
        v.kind: {"version": v.version, "reused": v.reused, **(v.verified or {})} for v in versions
    }
    recorder.event(events.VERSIONS_VERIFIED, json.dumps(found, sort_keys=True))


def checkpoint_extra(run_id: str, recipe: Recipe) -> dict[str, Any]:
    """What every checkpoint of the run records beside the training state."""
    return {"run_id": run_id, "recipe_sha256": recipe.digest()}


def prologue(
    world: World | None, progress: Progress | None, callbacks: Sequence[Any]
) -> tuple[World, Progress, Handoff | None]:
    """The start of every run: this process's world and progress, and on rank 0 the
    handoff it owes the other ranks (``None`` on those ranks: they ``follow``). Extra
    trainer callbacks are refused under ``torchrun`` (the other ranks hear of it)."""
    progress = progress or NullProgress()
    world = world or one_process()
    if not world.is_main:
        return world, progress, None
    handoff = Handoff(world)
    with handoff.guard():
        if callbacks and world.distributed:
            raise ValueError("extra trainer callbacks run in one process only")
    return world, progress, handoff


def handoff_message(
    run_id: str,
    data: BuiltVersion,
    tokens: BuiltVersion,
    recipe: Recipe,
    checkpoint_dir: Path,
    *,
    init: InitSource | None = None,
    checkpoint: Path | None = None,
    earlier: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What rank 0 hands the other ranks: the versions, the recipe as stored (a resumed
    one, or ``init_from`` resolved to a run id), where checkpoints go, and for a resume
    (or restart) the checkpoint to start from and the evaluations already recorded."""
    return {
        "data": data.version,
        "tokens": tokens.version,
        "run_id": run_id,
        "checkpoint_dir": str(checkpoint_dir),
        "recipe": recipe.to_dict(),
        "init": init.to_dict() if init is not None else None,
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "earlier": earlier,
    }
