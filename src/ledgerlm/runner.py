"""One run of a recipe: data -> tokens -> train -> checkpoint, every phase in the ledger.

The run is created in the ledger before any work, so the preparation time of
this run is part of its bill. A reused data or token version costs only the
time to find it; the manifest keeps what building it originally cost.

A run killed mid-training continues with ``resume_run``: the same ledger run,
reopened as ``running``, restored from its last checkpoint (a ``restore`` phase)
and trained on, making bitwise the updates the uninterrupted run would have made.

Under ``torchrun`` rank 0 does everything a single process does (data, tokens,
ledger, checkpoints, progress); it then hands the built versions to the other
ranks (``Handoff``), which train their share of each step and evaluate their
share of the validation set (``ledgerlm.train.distributed``).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ledgerlm.config import Recipe, TrainConfig, load_recipe, recipe_from_dict, recipe_to_toml
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.ledger.continued import before_after
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.model.gpt import GPT
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tokens.loader import test_batches, train_batches, validation_batches
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.budget import BudgetCallback
from ledgerlm.train.callbacks import ProgressCallback, StepLog
from ledgerlm.train.checkpoint import STATE, load_checkpoint, resolve_checkpoint
from ledgerlm.train.distributed import RankShard, World
from ledgerlm.train.evaluate import EvalCallback, evaluate, unigram_entropy, weights_digest
from ledgerlm.train.loop import Trainer, TrainState
from ledgerlm.train.optim import Optimizer, build_optimizer
from ledgerlm.train.resume import CheckpointCallback, ResumedEval, load_training, save_training
from ledgerlm.workspace import BuiltVersion, Workspace, atomic_write_text


@dataclass
class RunResult:
    run_id: str
    data: BuiltVersion
    tokens: BuiltVersion
    summary: dict[str, Any]  # read back from the ledger (empty on ranks other than 0)
    unigram_entropy: float
    params: int
    continued: list[dict[str, Any]] | None = None  # before/after rows (train.init_from)


@dataclass(frozen=True)
class InitSource:
    """The finished run a continued-pretraining run starts from."""

    run_id: str
    recipe: Recipe
    tokens_version: str
    checkpoint: Path


def _determinism(train: TrainConfig) -> None:
    """Seed, thread count and deterministic kernels: fixed per recipe and machine, so a
    resumed run repeats the uninterrupted run's float operations in the same order.
    Without ``train.threads`` the cores are shared by the processes on this node."""
    torch.manual_seed(train.seed)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(train.threads or max(1, (os.cpu_count() or 1) // local))
    torch.use_deterministic_algorithms(True)


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


def _same_replicas(model: torch.nn.Module, world: World) -> None:
    """Every rank must start from rank 0's weights; a mismatch means nondeterminism."""
    if not world.distributed:
        return
    mine = weights_digest(model)
    if world.broadcast_object(mine) != mine:
        raise RuntimeError(f"rank {world.rank}: initial weights differ from rank 0's")


@contextmanager
def _run_lock(run_dir: Path) -> Iterator[None]:
    """One process trains a run at a time; the kernel drops the lock when it dies."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LedgerError(f"run {run_dir.name} is being trained by another process") from None
        yield


@contextmanager
def _failing(ledger: Ledger, clock: PhaseClock, run_id: str) -> Iterator[None]:
    """Any error (Ctrl-C included) closes the open phase and marks the run failed."""
    try:
        yield
    except BaseException as exc:
        clock.stop()
        ledger.add_event(run_id, "error", f"{type(exc).__name__}: {exc}")
        ledger.finish_run(run_id, "failed")
        raise


def _val_batches(store: TokenStore, recipe: Recipe) -> list[Batch]:
    return validation_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)


def _validation(ledger: Ledger, run_id: str, store: TokenStore, recipe: Recipe):
    with ledger.phase(run_id, "eval", what="build validation set"):
        val = _val_batches(store, recipe)
        return val, unigram_entropy(val)


def _model(recipe: Recipe, store: TokenStore) -> tuple[GPT, Optimizer]:
    model = GPT(recipe.model, store.vocab_size)
    return model, build_optimizer(model, recipe.train)


def _stream(recipe: Recipe, store: TokenStore, world: World, cursor=None) -> RankShard:
    """This rank's share of the training stream (from ``cursor`` when resuming)."""
    t = recipe.train
    return RankShard(train_batches(store, recipe.pack, t.micro_batch_rows, t.seed, cursor), world)


def _train(
    ledger: Ledger,
    clock: PhaseClock,
    folder: Path,
    recipe: Recipe,
    parts: tuple[torch.nn.Module, Optimizer, Any, EvalCallback],
    progress: Progress,
    resumed: dict[str, Any] | None = None,
    world: World | None = None,
    started_at: float | None = None,
    test: list[Batch] | None = None,
) -> TrainState:
    """Train to max_steps, the target or the budget, checkpointing every
    ``checkpoint_every`` updates and at the end; ``resumed`` is the trainer state of the
    checkpoint resumed from; ``started_at`` is when the run's wall-time budget began."""
    model, optimizer, stream, evaluator = parts
    world = world or World()
    started_at = time.time() if started_at is None else started_at
    _same_replicas(model, world)
    run_id = clock.run_id
    extra = {"run_id": run_id, "recipe_sha256": recipe.digest()}
    with progress.task("train", total=recipe.train.max_steps) as task:
        trainer = Trainer(
            model,
            optimizer,
            recipe.train,
            stream,
            recipe.pack.attention,
            callbacks=[
                StepLog(recipe.eval.every_steps),
                evaluator,
                ProgressCallback(task),
                CheckpointCallback(folder, recipe.train.checkpoint_every, extra),
                BudgetCallback(recipe.eval, started_at),
            ],
            clock=clock,
            world=world,
        )
        if resumed is not None:
            trainer.load_state_dict(resumed)
            task.advance(trainer.state.step)
        state = trainer.fit()
    ledger.set_counters(run_id, state.counters())
    ledger.add_event(run_id, "train_end", state.stop_reason, step=state.step)
    with ledger.phase(run_id, "checkpoint", step_start=state.step):
        save_training(folder, trainer, extra)
    if test:
        _test_once(ledger, trainer, evaluator, test)
    ledger.finish_run(run_id, "reached" if evaluator.reached_step is not None else "not reached")
    return state


def _test_once(ledger: Ledger, trainer: Trainer, evaluator: EvalCallback, test: list[Batch]):
    """Score the final weights once on the held-out test split (``data.test_fraction``).

    The test set never decides anything during the run (the target is confirmed on
    the validation set, which tuning also uses); it gives the final figure.
    """
    step = trainer.state.step
    with ledger.phase(trainer.clock.run_id, "eval", step_start=step, what="test set, once"):
        with trainer.autocast():
            metrics = evaluate(trainer.model, test, evaluator.attention, evaluator.domains)
        record = {
            "step": step,
            "snapshot": weights_digest(trainer.model),
            "targets": sum(b.num_targets for b in test),
            "metrics": {f"test/{k}": v for k, v in metrics.items()},
        }
    ledger.add_event(trainer.clock.run_id, "test_evaluation", json.dumps(record), step=step)


def run_recipe(
    recipe: Recipe,
    workspace: Workspace,
    progress: Progress | None = None,
    world: World | None = None,
) -> RunResult:
    """Run ``recipe`` end to end; under ``torchrun`` pass the ``World`` on every rank."""
    progress = progress or NullProgress()
    world = world or World()
    if not world.is_main:
        return _follow(recipe, workspace, world)
    handoff = Handoff(world)
    _check_contract(recipe, world)
    ledger = Ledger(workspace.ledger_path)
    init = None
    if recipe.train.init_from:
        try:
            recipe, init = _init_source(recipe, ledger, workspace)
        except BaseException:
            ledger.close()
            raise
    run_id = ledger.create_run(
        recipe.name,
        recipe.to_dict(),
        target_metric=recipe.eval.metric,
        target_value=recipe.eval.target_loss,
        eval_every=recipe.eval.every_steps,
        meta={"contract": recipe.eval.contract()},
    )
    started_at = time.time()
    clock = PhaseClock(ledger, run_id)
    run_dir = workspace.run_dir(run_id)
    try:
        with handoff.guard(), _failing(ledger, clock, run_id), _run_lock(run_dir):
            atomic_write_text(run_dir / "recipe.toml", recipe_to_toml(recipe))
            with ledger.phase(run_id, "prep") as ph:
                data = prepare_data(recipe.data, workspace, progress)
                ph.detail.update(
                    version=data.version, reused=data.reused, built_seconds=data.build_seconds
                )
            with ledger.phase(run_id, "tokenize") as ph:
                tokens = build_tokens(data, recipe.tokenizer, workspace, progress)
                ph.detail.update(
                    version=tokens.version,
                    reused=tokens.reused,
                    built_seconds=tokens.build_seconds,
                )
            ledger.set_versions(run_id, data_version=data.version, tokens_version=tokens.version)
            store = TokenStore(tokens.path)
            _check_metric(recipe, store)
            handoff.send({"data": data.version, "tokens": tokens.version, "world": world.size})

            _determinism(recipe.train)
            val, entropy = _validation(ledger, run_id, store, recipe)
            contract = {
                **recipe.eval.contract(),
                "val_targets": sum(b.num_targets for b in val),
                "val_unigram_entropy": entropy,
                "ranks": world.size,
            }
            ledger.add_event(run_id, "target_contract", json.dumps(contract))

            model, optimizer = _model(recipe, store)
            shift = None
            if init is not None:
                with ledger.phase(run_id, "restore", what=f"initial weights of {init.run_id}"):
                    load_checkpoint(init.checkpoint, model)  # in place: the optimizer keeps it
                shift = _BeforeAfter(init, workspace, recipe)
                shift.score(ledger, run_id, "before", model, val, store.domains)
            stream = _stream(recipe, store, world)
            evaluator = EvalCallback(val, recipe.eval, recipe.pack.attention, store.domains)
            parts = (model, optimizer, stream, evaluator)
            folder = run_dir / "checkpoint"
            test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
            _train(ledger, clock, folder, recipe, parts, progress, None, world, started_at, test)
            continued = None
            if shift is not None:
                shift.score(ledger, run_id, "after", model, None, store.domains)
                continued = shift.report(ledger, run_id, evaluator.history[-1]["metrics"])
        summary = ledger.run_summary(run_id)
    finally:
        ledger.close()
    return RunResult(run_id, data, tokens, summary, entropy, model.num_params(), continued)


def _check_contract(recipe: Recipe, world: World) -> None:
    if recipe.eval.asynchronous and world.distributed:
        raise ValueError(
            "eval.asynchronous = true runs evaluation in a background thread, which cannot "
            "take part in torchrun's collectives; use synchronous evaluation under torchrun"
        )
    if recipe.train.init_from and world.distributed:
        raise ValueError("train.init_from (continued pretraining) runs in one process")


def _init_source(recipe: Recipe, ledger: Ledger, workspace: Workspace) -> tuple[Recipe, InitSource]:
    """Resolve ``train.init_from`` to a finished run; the recipe it returns names that run
    by id and reuses its tokenizer, so the stored recipe says exactly what was done."""
    run_id = ledger.resolve_run(str(recipe.train.init_from))
    run = ledger.run_summary(run_id)["run"]
    if run["status"] not in ("reached", "not reached"):
        raise LedgerError(f"train.init_from: run {run_id} has not finished ({run['status']})")
    start = recipe_from_dict(run["recipe"])
    if start.model != recipe.model:
        a, b = start.model.model_dump(), recipe.model.model_dump()
        diff = ", ".join(f"model.{k} {a[k]} != {b[k]}" for k in a if a[k] != b[k])
        raise ValueError(f"train.init_from: run {run_id} has another model shape ({diff})")
    tree = recipe.to_dict()
    tree["train"]["init_from"] = run_id
    reuse = tree["tokenizer"]["reuse"]
    if reuse not in (None, run["tokens_version"]):
        raise ValueError(
            f"tokenizer.reuse = {reuse!r}, but run {run_id} was trained with the tokenizer "
            f"of tokens version {run['tokens_version']}"
        )
    tree["tokenizer"]["reuse"] = run["tokens_version"]
    folder = workspace.run_dir(run_id) / "checkpoint"
    return recipe_from_dict(tree), InitSource(run_id, start, run["tokens_version"], folder)


class _BeforeAfter:
    """Scores the model on the new and the initial run's validation sets, before and
    after training, each time as an ``eval`` phase of this run."""

    def __init__(self, init: InitSource, workspace: Workspace, recipe: Recipe) -> None:
        self.init, self.recipe = init, recipe
        store = TokenStore(_version(workspace, "tokens", init.tokens_version).path)
        rows = recipe.train.micro_batch_rows
        self.old_val = validation_batches(store, init.recipe.pack, init.recipe.eval, rows)
        self.old_domains = store.domains
        self.scores: dict[str, dict[str, float]] = {}

    def score(self, ledger: Ledger, run_id: str, when: str, model, new_val, domains) -> None:
        bf16 = self.recipe.train.precision == "bf16"
        step = 0 if when == "before" else None
        with (
            ledger.phase(run_id, "eval", step_start=step, what=f"continued pretraining: {when}"),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16),
        ):
            if new_val is not None:
                attention = self.recipe.pack.attention
                self.scores[f"new_{when}"] = evaluate(model, new_val, attention, domains)
            attention = self.init.recipe.pack.attention
            self.scores[f"old_{when}"] = evaluate(model, self.old_val, attention, self.old_domains)

    def report(self, ledger: Ledger, run_id: str, new_after: dict[str, float]) -> list[dict]:
        sc = self.scores
        rows = before_after(sc["new_before"], new_after, sc["old_before"], sc["old_after"])
        message = json.dumps({"init_from": self.init.run_id, "rows": rows})
        ledger.add_event(run_id, "continued_pretraining", message)
        return rows


def _check_metric(recipe: Recipe, store: TokenStore) -> None:
    metric = recipe.eval.metric
    if metric != "loss" and metric.split("/", 1)[1] not in store.domains:
        raise ValueError(
            f"eval.metric = {metric!r}: the token version has no such domain "
            f"(domains: {', '.join(store.domains)})"
        )


def _version(workspace: Workspace, kind: str, version: str | None) -> BuiltVersion:
    found = version and workspace.reuse(kind, version, time.perf_counter())
    if not found:
        raise FileNotFoundError(f"the run's {kind} version {version} is not in {workspace.root}")
    return found


def _earlier(summary: dict[str, Any]) -> list[dict[str, Any]]:
    keys = ("step", "tokens", "targets", "updates", "metrics", "snapshot")
    return [{k: e[k] for k in keys} for e in summary["evaluations"]]


def resume_run(
    workspace: Workspace,
    run_ref: str,
    progress: Progress | None = None,
    world: World | None = None,
) -> RunResult:
    """Continue a killed or failed run from its last checkpoint, in the same ledger run.

    Evaluations the run already recorded stay; a step evaluated again after the
    restore reuses its row when the weights digest matches (see ``ResumedEval``).
    """
    progress = progress or NullProgress()
    world = world or World()
    if not world.is_main:
        return _follow(None, workspace, world)
    handoff = Handoff(world)
    with handoff.guard():
        if not workspace.ledger_path.is_file():
            raise LedgerError(f"{workspace.ledger_path}: no ledger here (run something first)")
        ledger = Ledger(workspace.ledger_path)
    try:
        with handoff.guard():
            run_id = ledger.resolve_run(run_ref)
            before = ledger.run_summary(run_id)
            run = before["run"]
            if run["status"] not in ("running", "failed"):
                raise LedgerError(f"run {run_id} has finished ({run['status']}); nothing to resume")
            run_dir = workspace.run_dir(run_id)
            folder = run_dir / "checkpoint"
            if not (resolve_checkpoint(folder) / STATE).is_file():
                raise LedgerError(
                    f"run {run_id} left no checkpoint to resume from "
                    "(train.checkpoint_every = N saves one every N updates)"
                )
        clock = PhaseClock(ledger, run_id)
        with handoff.guard(), _run_lock(run_dir):
            # The killed process's open phases end at their last heartbeat (a lower bound
            # of what it spent); only now, under the lock, is no live process writing them.
            closed = ledger.close_open_phases(run_id, "resume")
            if closed:
                message = [{k: p[k] for k in ("id", "kind", "seconds")} for p in closed]
                ledger.add_event(run_id, "closed_open_phases", json.dumps(message))
            ledger.finish_run(run_id, "running")
            # The wall-time budget counts the work recorded so far, not the time between
            # the kill and this resume.
            started_at = time.time() - ledger.run_summary(run_id)["total_seconds"]
            with _failing(ledger, clock, run_id):
                with ledger.phase(run_id, "restore") as ph:
                    recipe = load_recipe(run_dir / "recipe.toml")
                    _check_contract(recipe, world)
                    data = _version(workspace, "data", run["data_version"])
                    tokens = _version(workspace, "tokens", run["tokens_version"])
                    handoff.send(
                        {
                            "data": data.version,
                            "tokens": tokens.version,
                            "recipe": recipe.to_dict(),
                            "checkpoint": str(folder),
                            "earlier": _earlier(before),
                        }
                    )
                    model, optimizer, stream, saved, store = _restore(recipe, tokens, folder, world)
                    ph.step_end = saved["step"]
                    ph.detail.update(step=saved["step"], cursor=saved["data"]["cursor"])
                ledger.add_event(run_id, "resume", f"from step {saved['step']}", step=saved["step"])
                val, entropy = _validation(ledger, run_id, store, recipe)
                evaluator = ResumedEval(
                    val,
                    recipe.eval,
                    recipe.pack.attention,
                    store.domains,
                    earlier=_earlier(before),
                    step=saved["step"],
                )
                parts = (model, optimizer, stream, evaluator)
                resumed = saved["trainer"]
                test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
                _train(
                    ledger, clock, folder, recipe, parts, progress, resumed, world, started_at, test
                )
        summary = ledger.run_summary(run_id)
    finally:
        ledger.close()
    return RunResult(run_id, data, tokens, summary, entropy, model.num_params())


def _restore(recipe: Recipe, tokens: BuiltVersion, folder: Path, world: World):
    """Model, optimizer and this rank's data stream as the checkpoint left them."""
    _determinism(recipe.train)
    store = TokenStore(tokens.path)
    model, optimizer = _model(recipe, store)
    saved = load_training(folder, model, optimizer)
    if saved.get("recipe_sha256") != recipe.digest():
        raise ValueError(f"{folder.parent / 'recipe.toml'} does not match the checkpoint")
    return model, optimizer, _stream(recipe, store, world, saved["data"]), saved, store


def _follow(recipe: Recipe | None, workspace: Workspace, world: World) -> RunResult:
    """A rank other than 0: wait for rank 0's handoff, then train and evaluate its share.

    It writes nothing: the ledger, checkpoints and progress are rank 0's.
    """
    sent = world.broadcast_object(None)
    if sent is None:
        raise RuntimeError(f"rank {world.rank}: rank 0 failed before training (see its output)")
    data = _version(workspace, "data", sent["data"])
    tokens = _version(workspace, "tokens", sent["tokens"])
    resumed = None
    if "checkpoint" in sent:
        recipe = recipe_from_dict(sent["recipe"])
        model, optimizer, stream, saved, store = _restore(
            recipe, tokens, Path(sent["checkpoint"]), world
        )
        resumed = saved["trainer"]
        evaluator: EvalCallback = ResumedEval(
            *_eval_args(store, recipe), earlier=sent["earlier"], step=saved["step"]
        )
    else:
        assert recipe is not None
        _determinism(recipe.train)
        store = TokenStore(tokens.path)
        model, optimizer = _model(recipe, store)
        stream = _stream(recipe, store, world)
        evaluator = EvalCallback(*_eval_args(store, recipe))
    _same_replicas(model, world)
    trainer = Trainer(
        model,
        optimizer,
        recipe.train,
        stream,
        recipe.pack.attention,
        callbacks=[evaluator, BudgetCallback(recipe.eval, time.time())],
        world=world,
    )
    if resumed is not None:
        trainer.load_state_dict(resumed)
    trainer.fit()
    return RunResult("", data, tokens, {}, math.nan, model.num_params())


def _eval_args(store: TokenStore, recipe: Recipe) -> tuple[Any, ...]:
    return _val_batches(store, recipe), recipe.eval, recipe.pack.attention, store.domains
