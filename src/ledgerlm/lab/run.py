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
validation set (``ledgerlm.train.distributed``). What fresh runs, resumes and
follower ranks share (the prologue, the handoff, training to the end) is
``lab.skeleton``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerlm.config import Recipe, recipe_from_dict, recipe_to_toml
from ledgerlm.data.pipeline import check_inputs
from ledgerlm.lab.build import (
    build_evaluator,
    build_parts,
    build_trainer,
    placed,
    rank_threads,
    same_global_batch,
    test_set,
    val_batches,
)
from ledgerlm.lab.continued import BeforeAfter, InitSource, find_version, init_source
from ledgerlm.lab.mixture import plan
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.searches import charge_search, resolve_searches
from ledgerlm.lab.sinks import check_sinks, open_sinks
from ledgerlm.lab.skeleton import (
    check_contract,
    checkpoint_extra,
    close_training,
    eval_sets,
    failing,
    handoff_message,
    prepare_versions,
    prologue,
    run_lock,
    train_run,
)
from ledgerlm.ledger import events, resources
from ledgerlm.ledger.store import Ledger
from ledgerlm.mixture.plan import MixturePlan
from ledgerlm.progress import Progress
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.tokens.tokenizer import tokenizer_file
from ledgerlm.train.checkpoint import load_checkpoint
from ledgerlm.train.distributed import PeerLostError, World, watching_peers
from ledgerlm.train.memory import check_memory
from ledgerlm.train.record import Recorder
from ledgerlm.train.stopping import StopRule
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


def process_started_at() -> float:
    """When this process started (epoch seconds), as the operating system knows it."""
    import psutil

    return psutil.Process().create_time()


def charge_startup(ledger: Ledger, run_id: str, launched_at: float) -> None:
    """The command's start-up before the run existed, as a ``startup`` phase: the
    interpreter, importing torch and the lab, reading the recipe, opening the ledger."""
    seconds = max(0.0, time.time() - launched_at)
    ledger.record_phase(run_id, "startup", seconds, detail={"what": "interpreter and imports"})


def held_resources(world: World, recipe: Recipe, workspace: Workspace) -> dict[str, Any]:
    """What this process start of a run holds, for rank 0 to record for every rank (a
    ``resources`` event, ``ledger.resources``): the device of ``train.device`` (its name
    where CUDA, the processor otherwise), one device per rank, the ranks, the hosts
    torchrun spread them over, the threads per rank and the host's cores; with the price
    per device-hour in force (``[cost]`` of the recipe over ``<workspace>/cost.toml``)."""
    import torch

    kind = recipe.train.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(world.local_rank % torch.cuda.device_count())
    else:
        name = platform.processor() or platform.machine() or kind
    rate = resources.price(
        kind,
        name,
        recipe.cost.per_device_hour,
        resources.read_prices(workspace.root / "cost.toml"),
    )
    return resources.held(
        kind,
        name,
        world.size,
        hosts=resources.hosts_of(os.environ, world.size),
        threads_per_rank=rank_threads(recipe.train),
        host_cores=os.cpu_count(),
        price=rate,
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


def run_recipe(
    recipe: Recipe,
    workspace: Workspace,
    progress: Progress | None = None,
    world: World | None = None,
    on_plan: Callable[[MixturePlan], None] | None = None,
    callbacks: Sequence[Any] = (),
    launched_at: float | None = None,
    verify: bool = True,
    rules: Sequence[StopRule] = (),
) -> RunResult:
    """Run ``recipe`` end to end; under ``torchrun`` pass the ``World`` on every rank.

    ``on_plan`` receives the mixture plan (tokens and epochs per domain) once the
    token version is known, before the validation set and the model are built;
    ``callbacks`` are added to the trainer's (one process only). ``launched_at``: when
    the command running it started (``process_started_at()``, epoch seconds); the time
    from then to the run's creation (interpreter, imports, reading the recipe) is
    charged as a ``startup`` phase, so the bill holds what the user waited for. Reused
    versions are checked against their manifests; ``verify=False`` skips the content
    hashes (sizes, counts and token ids are still checked). ``rules`` may stop the run
    early at an evaluation (``train.stopping``; one process only, as ``callbacks``)."""
    world, progress, handoff = prologue(world, progress, callbacks)
    if handoff is None:
        return follow(workspace, world)
    with handoff.guard():
        world = placed(world, recipe.train)
        check_contract(recipe, world)
        # what cannot fit is refused here, unless only the token version tells the vocabulary
        fits = check_memory(recipe, world)
        check_inputs(recipe.data_stage())  # a missing input writes nothing, not even the ledger
        check_sinks(recipe)  # nor a sink whose library is missing
        if recipe.tokenizer.from_ is not None:
            tokenizer_file(recipe.tokenizer.from_)
        held = held_resources(world, recipe, workspace)  # a bad cost.toml writes nothing
        ledger = Ledger(workspace.ledger_path, patience=recipe.log.ledger_timeout)
    init = None
    try:
        if recipe.train.init_from:
            recipe, init = init_source(recipe, ledger, workspace)
        recipe, searches = resolve_searches(recipe, workspace, ledger)
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
    for search in searches:  # the searches the recipe was chosen by: on its bill
        charge_search(ledger, run_id, search)
    # after the phases charged before it, which count its devices (ledger.resources)
    ledger.add_event(run_id, events.RESOURCES, json.dumps(held))
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
            folder = run_dir / "checkpoint"
            handoff.send(handoff_message(run_id, data, tokens, recipe, folder, init=init))

            mixture_plan = record_plan(recorder, recipe, store, world.size)
            if on_plan is not None:
                on_plan(mixture_plan)
            sets = eval_sets(recorder, store, recipe, workspace, data.path)
            contract = {
                **recipe.eval.contract(),
                "val_targets": sum(b.num_targets for b in sets.val),
                "val_unigram_entropy": sets.entropy,
                "ranks": world.size,
            }
            recorder.event(events.TARGET_CONTRACT, json.dumps(contract))

            recorder.start("setup", what="model, optimizer, data stream")
            parts, _ = build_parts(recipe, store, world)
            evaluator = build_evaluator(
                sets.val, recipe, store, rules=rules, ranks=world.size, tasks=sets.tasks
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
                checkpoints=(folder, checkpoint_extra(run_id, recipe)),
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


def follow(workspace: Workspace, world: World) -> RunResult:
    """A rank other than 0: wait for rank 0's handoff, then train and evaluate its share.

    It writes nothing: the ledger, checkpoints and progress are rank 0's.
    """
    sent = world.broadcast_object(None)
    if sent is None:
        raise PeerLostError(f"rank {world.rank}: rank 0 failed before training (see its output)")
    data = find_version(workspace, "data", sent["data"], verify=False)  # rank 0 checked them
    tokens = find_version(workspace, "tokens", sent["tokens"], verify=False)
    store = TokenStore(tokens.path)
    recipe = recipe_from_dict(sent["recipe"])  # as rank 0 stored it (see handoff_message)
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
    ranks = saved.get("ranks", 1) if saved else world.size
    evaluator = build_evaluator(val, recipe, store, sent["earlier"], saved, ranks=ranks)
    # A sharded model is saved and tested by every rank, so this rank checkpoints too.
    checkpoints = (Path(sent["checkpoint_dir"]), checkpoint_extra(sent["run_id"], recipe))
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
        test = test_set(store, recipe)
        close_training(trainer, evaluator, test)
    if shift is not None:
        shift.score(Recorder(), "after", parts.model, None, store.domains, world)
    return RunResult("", data, tokens, {}, math.nan, parts.model.num_params())
