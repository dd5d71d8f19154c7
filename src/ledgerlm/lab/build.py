"""The parts of training a run needs, built in one place for fresh runs, resumes and
follower ranks: determinism, model and optimizer, this rank's data stream, the
validation batches, the evaluator, and the ``Trainer`` with its callbacks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ledgerlm.config import Recipe, TrainConfig
from ledgerlm.lab.mixture import segments, token_budget
from ledgerlm.ledger import events
from ledgerlm.model.gpt import GPT
from ledgerlm.tasks.items import TaskSet
from ledgerlm.tokens.loader import test_batches, train_batches, validation_batches
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.backends import environment, set_up, tf32_note
from ledgerlm.train.budget import BudgetCallback
from ledgerlm.train.checkpointing import CheckpointCallback, ResumedEval, load_training
from ledgerlm.train.distributed import RankShard, World
from ledgerlm.train.evaluate import EvalCallback, weights_digest
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import Optimizer, build_optimizer
from ledgerlm.train.parallelize import pad_rows, parallelize
from ledgerlm.train.progress import ProgressCallback
from ledgerlm.train.record import Recorder
from ledgerlm.train.stopping import StopRule, plan_rules
from ledgerlm.train.task_eval import Tasks


def rank_threads(train: TrainConfig) -> int:
    """The intra-op threads a rank trains with: ``train.threads``, else this node's cores
    shared by its ranks (torchrun's ``LOCAL_WORLD_SIZE``)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return train.threads or max(1, (os.cpu_count() or 1) // local)


def determinism(train: TrainConfig) -> None:
    """Seed, thread count and (``train.deterministic``, the default) deterministic
    kernels: fixed per recipe and machine, so a resumed run repeats the uninterrupted
    run's float operations in the same order. Without ``train.threads`` the cores are
    shared by the processes on this node.

    On CUDA, cuBLAS is deterministic only with a fixed workspace: without
    ``CUBLAS_WORKSPACE_CONFIG`` torch refuses the first matmul under deterministic
    algorithms. It is set here (a value the user exported is kept), before any cuBLAS
    handle exists. Torch's NaN-filling of every new allocation under deterministic
    algorithms is turned off: it only makes a read of memory nothing wrote visible,
    the library reads none (the bitwise resume tests would see one), and on a GPU it
    costs a write of every activation."""
    torch.manual_seed(train.seed)
    torch.set_num_threads(rank_threads(train))
    if train.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(train.deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = False


def placed(world: World, train: TrainConfig) -> World:
    """The world on the recipe's device and engine, its collectives bounded by
    ``train.collective_timeout`` once training starts (``build_trainer``).
    ``train.parallel = "auto"`` shards with FSDP2 under torchrun, except for Muon (which
    needs whole matrices: DDP)."""
    parallel = train.parallel
    if parallel == "auto" and world.distributed:
        parallel = "ddp" if train.optimizer == "muon" else "fsdp"
    return world.placed(train.device, parallel, timeout=train.collective_timeout)


@dataclass
class Parts:
    """What a trainer is made of: the model, its optimizer, this rank's data stream, and
    the engine the training step calls (``parallelize``'s: the model, or DDP around it)."""

    model: GPT
    optimizer: Optimizer
    stream: RankShard
    store: TokenStore
    engine: torch.nn.Module


def build_parts(
    recipe: Recipe, store: TokenStore, world: World, checkpoint: Path | None = None
) -> tuple[Parts, dict[str, Any] | None]:
    """Seed, then the model and optimizer (fresh, or as the resumable ``checkpoint``
    folder left them, RNG included) and this rank's share of the training stream from
    the start or from the checkpoint's cursor. Returns the checkpoint's JSON state too."""
    determinism(recipe.train)
    set_up(recipe.train, world)  # TF32, NCCL: before the first CUDA kernel and communicator
    t = recipe.train
    model = GPT(recipe.model, store.vocab_size, device="meta")
    # checkpointing, compile, FSDP2 (before any memory is spent), the weights, DDP
    engine = parallelize(model, world, t)
    optimizer = build_optimizer(model, t)
    saved = None
    if checkpoint is not None:
        saved = load_training(checkpoint, model, optimizer)
        if saved.get("recipe_sha256") != recipe.digest():
            raise ValueError(f"{checkpoint.parent / 'recipe.toml'} does not match the checkpoint")
    cursor = saved["data"] if saved else None
    # stage ends are shares of the budget of the run as it started: its rank count
    ranks = saved.get("ranks", world.size) if saved else world.size
    mix = segments(recipe, store, ranks)
    stream = train_batches(store, recipe.pack, t.micro_batch_rows, t.seed, cursor, mix)
    return Parts(model, optimizer, RankShard(stream, world), store, engine), saved


def same_global_batch(recipe: Recipe, saved_ranks: int, world: World) -> Recipe:
    """The recipe a checkpoint written by ``saved_ranks`` ranks trains on with this
    world: one update still covers ``grad_accum x saved_ranks`` micro-batches of the one
    global stream, so the run continues with the same global batches (the accumulation
    per rank changes; it must come out whole)."""
    if saved_ranks == world.size:
        return recipe
    total = recipe.train.grad_accum * saved_ranks
    if total % world.size:
        raise ValueError(
            f"the checkpoint was written by {saved_ranks} rank(s) with grad_accum "
            f"{recipe.train.grad_accum}: {total} micro-batches per update cannot be split "
            f"over {world.size} ranks"
        )
    train = recipe.train.model_copy(update={"grad_accum": total // world.size})
    return recipe.model_copy(update={"train": train})


def val_batches(store: TokenStore, recipe: Recipe) -> list[Batch]:
    """The fixed validation set of a recipe, in batches of ``micro_batch_rows``; under
    ``train.compile`` the last one padded to them, so evaluation keeps the compiled
    shape (``pad_rows``: the padding scores nothing)."""
    rows = recipe.train.micro_batch_rows
    val = validation_batches(store, recipe.pack, recipe.eval, rows)
    return pad_rows(val, rows) if recipe.train.compile else val


def test_set(store: TokenStore, recipe: Recipe) -> list[Batch]:
    """The test split of a recipe (scored after training), batched and padded as
    ``val_batches``: whole unless ``eval.test_max_tokens`` caps it."""
    rows = recipe.train.micro_batch_rows
    test = test_batches(store, recipe.pack, recipe.eval, rows)
    return pad_rows(test, rows) if recipe.train.compile else test


def run_tasks(recipe: Recipe, store: TokenStore, sets: Sequence[TaskSet] | None) -> Tasks | None:
    """The recipe's downstream tasks as the evaluator scores them (``None`` without any):
    the items rank 0 resolved (``sets``; ``None`` on the other ranks, which get rank 0's
    when training starts), with the token version's tokenizer, BOS (every training
    document starts with it) and EOS, the context of ``pack.seq_len`` tokens and forwards of
    ``train.micro_batch_rows`` rows, as the validation batches."""
    if not recipe.eval.tasks:
        return None
    frozen = tuple(sets) if sets is not None else None
    rows = recipe.train.micro_batch_rows
    bos, eos = store.special.get("bos"), store.special.get("eos")
    seq_len, static = recipe.pack.seq_len, recipe.train.compile
    return Tasks(frozen, store.tokenizer, bos, eos, seq_len, rows, static)


def build_evaluator(
    val: list[Batch],
    recipe: Recipe,
    store: TokenStore,
    earlier: list[dict[str, Any]] | None = None,
    saved: dict[str, Any] | None = None,
    rules: Sequence[StopRule] = (),
    ranks: int = 1,
    tasks: Sequence[TaskSet] | None = None,
) -> EvalCallback:
    """The run's evaluator on the validation batches ``val``. A resumed (or restarted)
    run passes the ``earlier`` evaluations the ledger holds and the checkpoint's state
    ``saved`` (``None`` from step 0): a ``ResumedEval``, owing the evaluation the
    checkpoint says was owed (``lab.skeleton.checkpointed_if_locked``). The recipe's
    stopping plan (``eval.patience``, ``eval.project``: ``train.stopping.plan_rules``, on
    the token budget of ``ranks`` ranks, the ranks the run's global batch is made for)
    and then ``rules`` (a tuning trial's pruner) may stop the run early at an evaluation.
    ``tasks``: the recipe's downstream tasks as rank 0 resolved them (``run_tasks``)."""
    planned = plan_rules(recipe.eval, token_budget(recipe, ranks))
    rules = (*planned, *rules)
    args = (val, recipe.eval, recipe.pack.attention, store.domains, store.text, rules)
    scored = run_tasks(recipe, store, tasks)
    if earlier is None:
        return EvalCallback(*args, tasks=scored)
    step = saved["step"] if saved else 0
    owed = bool(saved and saved.get("owed_evaluation"))
    return ResumedEval(*args, earlier=earlier, step=step, owed=owed, tasks=scored)


def same_replicas(model: torch.nn.Module, world: World) -> None:
    """Every rank must start from rank 0's weights; a mismatch means nondeterminism."""
    if not world.distributed or world.sharded:  # shards differ by design
        return
    mine = weights_digest(model)
    if world.broadcast_object(mine) != mine:
        raise RuntimeError(f"rank {world.rank}: initial weights differ from rank 0's")


def build_trainer(
    recipe: Recipe,
    parts: Parts,
    evaluator: EvalCallback,
    world: World,
    *,
    started_at: float,
    recorder: Recorder | None = None,
    task: Any = None,
    checkpoints: tuple[Path, dict[str, Any]] | None = None,
    resumed: dict[str, Any] | None = None,
    more: Sequence[Any] = (),
    before: tuple[float, float] = (0.0, 0.0),
) -> Trainer:
    """The trainer of a run on this rank.

    ``started_at`` (a ``time.time()``) is when the run's wall-time budget began;
    ``before`` the (wall, device) seconds the ledger charged a resumed run before this
    process, for its device-time budget (``train.budget``);
    ``task`` a progress task advanced per update; ``checkpoints`` (folder, extra JSON
    state) saves every ``train.checkpoint_every`` updates; ``resumed`` is the trainer
    state of the checkpoint resumed from. Rank 0 passes the ledger's recorder, a task
    and checkpoints; other ranks pass none of them. ``more`` callbacks run after the
    evaluator (they see each evaluation at its step) and before the budget check. The
    recorder gets the process's ``environment`` event (device, versions, TF32, NCCL:
    ``train/backends.py``) and, where ``train.tf32`` has no TF32 to use, a note.
    """
    same_replicas(parts.model, world)
    if recorder is not None:
        recorder.event(events.ENVIRONMENT, json.dumps(environment(world)))
        if (note := tf32_note(recipe.train, world)) is not None:
            recorder.note(note)
    callbacks: list[Any] = [evaluator]
    if task is not None:
        callbacks.append(ProgressCallback(task))
    if checkpoints is not None:
        folder, state = checkpoints
        every = recipe.train.checkpoint_every
        callbacks.append(CheckpointCallback(folder, every, state, evaluator))
    callbacks.extend(more)
    callbacks.append(BudgetCallback(recipe.eval, started_at, before))
    trainer = Trainer(
        parts.model,
        parts.optimizer,
        recipe.train,
        parts.stream,
        recipe.pack.attention,
        callbacks=callbacks,
        recorder=recorder,
        world=world,
        engine=parts.engine,
    )
    if resumed is not None:
        trainer.load_state_dict(resumed)
        if task is not None:
            task.advance(trainer.state.step)
    world.start_together()  # from here each collective waits train.collective_timeout
    return trainer
