"""One run of a recipe: data -> tokens -> train -> checkpoint, every second in a phase.

The run is created in the ledger before any work, so the preparation time of this run
is part of its bill. A reused data or token version costs only the time to find it;
the manifest keeps what building it originally cost. From the run's creation to its
end, one ``LedgerRecorder`` keeps exactly one phase open (``setup``, ``prep``,
``tokenize``, ``eval``, ``restore``, ``train``, ``checkpoint``), each starting where the
previous one ended, so the phases cover the run's wall time and time-to-target is
the wall time until the confirming evaluation.

A run killed mid-training continues with ``resume_run`` (``lab.resume``). Under
``torchrun`` rank 0 does everything a single process does (data, tokens, ledger,
checkpoints, progress); it then hands the built versions to the other ranks
(``Handoff``), which train their share of each step and evaluate their share of the
validation set (``ledgerlm.train.distributed``).
"""

from __future__ import annotations

import fcntl
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerlm.config import Recipe, recipe_from_dict, recipe_to_toml
from ledgerlm.data.contamination import contamination_warnings
from ledgerlm.data.pipeline import check_inputs, prepare_data
from ledgerlm.lab.build import (
    Parts,
    build_parts,
    build_trainer,
    placed,
    same_global_batch,
    val_batches,
)
from ledgerlm.lab.continued import BeforeAfter, InitSource, find_version, init_source
from ledgerlm.lab.mixture import plan, use_search
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.signals import received, signal_name, undisturbed
from ledgerlm.lab.sinks import check_sinks, open_sinks
from ledgerlm.ledger import events
from ledgerlm.ledger.store import Ledger, LedgerBusyError, LedgerError
from ledgerlm.mixture.plan import MixturePlan
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tokens.loader import test_batches
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.tokens.tokenizer import tokenizer_file
from ledgerlm.train.checkpoint import load_checkpoint
from ledgerlm.train.checkpointing import ResumedEval, save_training
from ledgerlm.train.distributed import PeerLostError, World, one_process, watching_peers
from ledgerlm.train.evaluate import EvalCallback, evaluate, unigram_entropy, weights_digest
from ledgerlm.train.loop import Trainer
from ledgerlm.train.memory import check_memory
from ledgerlm.train.record import Recorder
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
    if recipe.train.optimizer == "muon" and world.sharded:
        raise ValueError(
            "train.optimizer = 'muon' orthogonalizes whole matrices, which FSDP shards; "
            "use train.parallel = 'ddp' with muon"
        )


def check_metric(recipe: Recipe, store: TokenStore) -> None:
    """The metric and the per-domain targets name domains the token version has."""
    metric = recipe.eval.metric
    if metric != "loss" and metric.split("/", 1)[1] not in store.domains:
        raise ValueError(
            f"eval.metric = {metric!r}: the token version has no such domain "
            f"(domains: {', '.join(store.domains)})"
        )
    unknown = sorted(set(recipe.eval.targets) - set(store.domains))
    if unknown:
        raise ValueError(
            f"eval.targets names domain(s) {', '.join(unknown)} that the token version does "
            f"not have (domains: {', '.join(store.domains)})"
        )


@dataclass
class EvalSets:
    """The fixed validation set (its unigram entropy) and the once-only test set."""

    val: list[Batch]
    entropy: float
    test: list[Batch]


def eval_sets(recorder: LedgerRecorder, store: TokenStore, recipe: Recipe) -> EvalSets:
    """Build the validation and test batches as an ``eval`` phase."""
    recorder.start("eval", what="build validation set")
    val = val_batches(store, recipe)
    test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
    return EvalSets(val, unigram_entropy(val), test)


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
) -> Trainer:
    """Build the trainer (a ``setup`` phase), train to max_steps, the target or the
    budget; then the final checkpoint, the once-only test score, and the run's status
    (reached or not). ``resumed`` is the trainer state of the checkpoint resumed from."""
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
        )
        with checkpointed_if_locked(recorder, trainer, evaluator, checkpoints):
            trainer.fit()
    with checkpointed_if_locked(recorder, trainer, evaluator, checkpoints):
        close_training(recorder, trainer, evaluator, checkpoints, test)
        reached = evaluator.reached_step is not None
        recorder.ledger.finish_run(recorder.run_id, "reached" if reached else "not reached")
    return trainer


@contextmanager
def checkpointed_if_locked(
    recorder: LedgerRecorder,
    trainer: Trainer,
    evaluator: EvalCallback,
    checkpoints: tuple[Path, dict[str, Any]],
) -> Iterator[None]:
    """A ledger another process held past ``log.ledger_timeout`` stops the run, but only
    once it is checkpointed where it stands (the updates the ledger has not taken and
    an evaluation owed at that step go in the checkpoint), so ``ledgerlm resume``
    continues it; ``failing`` then marks it failed. A sharded run, which every rank
    checkpoints together, stops at its last checkpoint."""
    try:
        yield
    except LedgerBusyError as exc:
        if trainer.world.sharded:
            raise
        step = trainer.state.step
        folder, extra = checkpoints
        kept = {"unwritten_steps": recorder.rows} if recorder.rows else {}
        owed = {"owed_evaluation": True} if evaluator.owed else {}
        save_training(folder, trainer, {**extra, **kept, **owed})
        raise LedgerBusyError(
            f"{exc}, past log.ledger_timeout = {recorder.ledger.patience:g} s: the run is "
            f"checkpointed at step {step} (ledgerlm resume {recorder.run_id} continues it)"
        ) from None


def close_training(
    recorder: Recorder,
    trainer: Trainer,
    evaluator: EvalCallback,
    checkpoints: tuple[Path, dict[str, Any]],
    test: list[Batch],
) -> None:
    """The final checkpoint and the once-only test score. Rank 0 does it; with a sharded
    model every rank does (both gather the weights from all ranks)."""
    state = trainer.state
    recorder.start("checkpoint", state.step)
    recorder.counters(state.counters())
    recorder.event(events.TRAIN_END, state.stop_reason, step=state.step)
    folder, extra = checkpoints
    save_training(folder, trainer, extra)
    if test:
        _test_once(recorder, trainer, evaluator, test)
    recorder.stop()


def _test_once(
    recorder: Recorder, trainer: Trainer, evaluator: EvalCallback, test: list[Batch]
) -> None:
    """Score the final weights once on the held-out test split (``data.test_fraction``).

    The test set never decides anything during the run (the target is confirmed on
    the validation set, which tuning also uses); it gives the final figure.
    """
    step = trainer.state.step
    recorder.start("eval", step, what="test set, once")
    world = trainer.world if trainer.world.sharded else None  # a sharded model: every rank
    with trainer.autocast():
        metrics = evaluate(
            trainer.model, test, evaluator.attention, evaluator.domains, world, evaluator.text
        )
    record = {
        "step": step,
        "snapshot": weights_digest(trainer.model),
        "targets": sum(b.num_targets for b in test),
        "metrics": {f"test/{k}": v for k, v in metrics.items()},
    }
    recorder.event(events.TEST_EVALUATION, json.dumps(record), step=step)


def process_started_at() -> float:
    """When this process started (epoch seconds), as the operating system knows it."""
    import psutil

    return psutil.Process().create_time()


def charge_startup(ledger: Ledger, run_id: str, launched_at: float) -> None:
    """The command's start-up before the run existed, as a ``startup`` phase: the
    interpreter, importing torch and the lab, reading the recipe, opening the ledger."""
    seconds = max(0.0, time.time() - launched_at)
    ledger.record_phase(run_id, "startup", seconds, detail={"what": "interpreter and imports"})


def charge_search(ledger: Ledger, run_id: str, search: dict[str, Any]) -> None:
    """The mixture search whose result the run uses, as a ``search`` phase holding the
    search's wall time (it ended before the run began), so time-to-target includes it."""
    ledger.record_phase(
        run_id,
        "search",
        float(search["seconds"]),
        detail={
            "search_id": search["search_id"],
            "trials": [t["run"] for t in search["trials"]],
            "objective": search["objective"],
        },
    )


def record_plan(
    recorder: LedgerRecorder, recipe: Recipe, store: TokenStore, ranks: int
) -> MixturePlan:
    """The mixture plan of the run (refusing a mixture that names an unknown domain),
    kept in the ledger as a ``mixture_plan`` event, with a ``mixture_warning`` event per
    domain repeated more than ``data.mixture.max_epochs`` times."""
    planned = plan(recipe, store, ranks)
    recorder.event(events.MIXTURE_PLAN, json.dumps(planned.to_dict()))
    for line in planned.warnings:
        recorder.event(events.MIXTURE_WARNING, line)
    return planned


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


def run_recipe(
    recipe: Recipe,
    workspace: Workspace,
    progress: Progress | None = None,
    world: World | None = None,
    on_plan: Callable[[MixturePlan], None] | None = None,
    callbacks: Sequence[Any] = (),
    launched_at: float | None = None,
    verify: bool = True,
) -> RunResult:
    """Run ``recipe`` end to end; under ``torchrun`` pass the ``World`` on every rank.

    ``on_plan`` receives the mixture plan (tokens and epochs per domain) once the
    token version is known, before the validation set and the model are built;
    ``callbacks`` are added to the trainer's (one process only). ``launched_at``: when
    the command running it started (``process_started_at()``, epoch seconds); the time
    from then to the run's creation (interpreter, imports, reading the recipe) is
    charged as a ``startup`` phase, so the bill holds what the user waited for. Reused
    versions are checked against their manifests; ``verify=False`` skips the content
    hashes (sizes, counts and token ids are still checked)."""
    progress = progress or NullProgress()
    world = world or one_process()
    if not world.is_main:
        return follow(recipe, workspace, world)
    handoff = Handoff(world)
    with handoff.guard():
        if callbacks and world.distributed:
            raise ValueError("extra trainer callbacks run in one process only")
        world = placed(world, recipe.train)
        check_contract(recipe, world)
        # what cannot fit is refused here, unless only the token version tells the vocabulary
        fits = check_memory(recipe, world)
        check_inputs(recipe.data_stage())  # a missing input writes nothing, not even the ledger
        check_sinks(recipe)  # nor a sink whose library is missing
        if recipe.tokenizer.from_ is not None:
            tokenizer_file(recipe.tokenizer.from_)
        ledger = Ledger(workspace.ledger_path, patience=recipe.log.ledger_timeout)
    init = search = None
    try:
        if recipe.train.init_from:
            recipe, init = init_source(recipe, ledger, workspace)
        recipe, search = use_search(recipe, workspace)
    except BaseException:
        ledger.close()
        raise
    run_id = ledger.create_run(
        recipe.name,
        recipe.to_dict(),
        target_metric=recipe.eval.target()[0],
        target_value=recipe.eval.target()[1],
        eval_every=recipe.eval.every_steps,
        meta={"contract": recipe.eval.contract()},
    )
    started_at = time.time()
    if launched_at is not None:
        charge_startup(ledger, run_id, launched_at)
    if search is not None:
        charge_search(ledger, run_id, search)
    recorder = LedgerRecorder(
        ledger, run_id, flush_every=recipe.eval.every_steps, note=progress.note
    )
    recorder.start("setup", what="run folder and recipe")
    run_dir = workspace.run_dir(run_id)
    try:
        with handoff.guard(), failing(recorder), watching_peers(world), run_lock(run_dir):
            open_sinks(recorder, recipe, run_dir)  # rank 0 only: followers have no recorder
            atomic_write_text(run_dir / "recipe.toml", recipe_to_toml(recipe))
            data, tokens, store = prepare_versions(recorder, recipe, workspace, progress, verify)
            if fits is None:
                check_memory(recipe, world, store.vocab_size)
            handoff.send(
                {
                    "data": data.version,
                    "tokens": tokens.version,
                    "world": world.size,
                    "run_id": run_id,
                    "checkpoint_dir": str(run_dir / "checkpoint"),
                    "recipe": recipe.to_dict(),  # as stored: init_from resolved to a run id
                    "init": init.to_dict() if init is not None else None,
                }
            )

            mixture_plan = record_plan(recorder, recipe, store, world.size)
            if on_plan is not None:
                on_plan(mixture_plan)
            sets = eval_sets(recorder, store, recipe)
            contract = {
                **recipe.eval.contract(),
                "val_targets": sum(b.num_targets for b in sets.val),
                "val_unigram_entropy": sets.entropy,
                "ranks": world.size,
            }
            recorder.event(events.TARGET_CONTRACT, json.dumps(contract))

            recorder.start("setup", what="model, optimizer, data stream")
            parts, _ = build_parts(recipe, store, world)
            evaluator = EvalCallback(
                sets.val, recipe.eval, recipe.pack.attention, store.domains, store.text
            )
            shift = None
            if init is not None:
                recorder.start("restore", what=f"initial weights of {init.run_id}")
                load_checkpoint(init.checkpoint, parts.model)  # in place: the optimizer keeps it
                shift = BeforeAfter(init, workspace, recipe)
                shift.score(recorder, "before", parts.model, sets.val, store.domains, world)
            train_run(
                recorder,
                recipe,
                parts,
                evaluator,
                world,
                started_at=started_at,
                progress=progress,
                checkpoints=(run_dir / "checkpoint", checkpoint_extra(run_id, recipe)),
                test=sets.test,
                more=callbacks,
            )
            continued = None
            if shift is not None:
                shift.score(recorder, "after", parts.model, None, store.domains, world)
                recorder.stop()
                continued = shift.report(recorder, evaluator.history[-1]["metrics"])
        summary = ledger.run_summary(run_id)
    finally:
        ledger.close()
    params = parts.model.num_params()
    return RunResult(run_id, data, tokens, summary, sets.entropy, params, continued)


def checkpoint_extra(run_id: str, recipe: Recipe) -> dict[str, Any]:
    """What every checkpoint of the run records beside the training state."""
    return {"run_id": run_id, "recipe_sha256": recipe.digest()}


def follow(recipe: Recipe | None, workspace: Workspace, world: World) -> RunResult:
    """A rank other than 0: wait for rank 0's handoff, then train and evaluate its share.

    It writes nothing: the ledger, checkpoints and progress are rank 0's.
    """
    sent = world.broadcast_object(None)
    if sent is None:
        raise PeerLostError(f"rank {world.rank}: rank 0 failed before training (see its output)")
    data = find_version(workspace, "data", sent["data"], verify=False)  # rank 0 checked them
    tokens = find_version(workspace, "tokens", sent["tokens"], verify=False)
    store = TokenStore(tokens.path)
    again = "earlier" in sent  # a resume (from a checkpoint) or a restart (from step 0)
    if "recipe" in sent:  # the recipe rank 0 stored (a resumed one, or init_from resolved)
        recipe = recipe_from_dict(sent["recipe"])
    assert recipe is not None
    world = placed(world, recipe.train)
    folder = Path(sent["checkpoint"]) if sent.get("checkpoint") else None
    parts, saved = build_parts(recipe, store, world, folder)
    val = val_batches(store, recipe)
    shift = None
    if sent.get("init"):  # continued pretraining: the same initial weights and scores
        init = InitSource.from_dict(sent["init"])
        load_checkpoint(init.checkpoint, parts.model)
        shift = BeforeAfter(init, workspace, recipe)
        shift.score(Recorder(), "before", parts.model, val, store.domains, world)
    args = (val, recipe.eval, recipe.pack.attention, store.domains, store.text)
    owed = bool(saved and saved.get("owed_evaluation"))  # see checkpointed_if_locked
    evaluator = (
        ResumedEval(*args, earlier=sent["earlier"], step=saved["step"] if saved else 0, owed=owed)
        if again
        else EvalCallback(*args)
    )
    # A sharded model is saved and tested by every rank, so this rank checkpoints too.
    checkpoints = (Path(sent["checkpoint_dir"]), checkpoint_extra(sent["run_id"], recipe))
    ranks = saved.get("ranks", 1) if saved else world.size
    trainer = build_trainer(
        same_global_batch(recipe, ranks, world),
        parts,
        evaluator,
        world,
        started_at=time.time(),
        checkpoints=checkpoints if world.sharded else None,
        resumed=saved["trainer"] if saved else None,
    )
    trainer.fit()
    if world.sharded:
        test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
        close_training(Recorder(), trainer, evaluator, checkpoints, test)
    if shift is not None:
        shift.score(Recorder(), "after", parts.model, None, store.domains, world)
    return RunResult("", data, tokens, {}, math.nan, parts.model.num_params())
