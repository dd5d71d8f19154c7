"""Resuming a killed or failed run from its last checkpoint, in the same ledger run.

The run is reopened as ``running`` and restored from its last checkpoint (a
``restore`` phase marked ``resume``); it then makes bitwise the updates the
uninterrupted run would have made. The time between the death of the old process and
the restore is not the run's work and is not charged; from the restore on, every second
is in a phase again.

``continue_run`` continues the run a plan names (a sweep's point, a search's trial):
reused when it finished, resumed (or restarted) when it did not, started when the
ledger has none; so running a plan again trains nothing twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ledgerlm.config import Recipe, load_recipe, recipe_from_dict
from ledgerlm.lab.build import build_evaluator, build_parts, placed, same_global_batch
from ledgerlm.lab.continued import find_version
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.run import RunResult, follow, held_resources, run_recipe
from ledgerlm.lab.searches import resolved_recipe
from ledgerlm.lab.sinks import check_sinks, open_sinks
from ledgerlm.lab.skeleton import (
    check_contract,
    check_metric,
    checkpoint_extra,
    eval_sets,
    failing,
    handoff_message,
    prepare_versions,
    prologue,
    run_lock,
    train_run,
    unchanged_tasks,
)
from ledgerlm.lab.status import interrupted
from ledgerlm.lab.tasks import resolve_tasks
from ledgerlm.ledger import events
from ledgerlm.ledger.store import Ledger, LedgerError, require_ledger
from ledgerlm.ledger.target import EVAL_AFTER, in_the_run
from ledgerlm.progress import Progress
from ledgerlm.tasks.items import TaskSet
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.checkpoint import STATE, resolve_checkpoint
from ledgerlm.train.distributed import World
from ledgerlm.train.stopping import StopRule
from ledgerlm.workspace import BuiltVersion, Workspace

FINISHED = ("reached", "not reached", "pruned")


def _earlier(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's own evaluations, which the resumed evaluator replays into its
    confirmation and stop rules and reuses at a step it evaluates again. Those written
    after the fact (``ledgerlm eval``, bound to ``eval_after`` phases) are not the
    run's: a tasks-only score of a snapshot would otherwise pass for the run's
    evaluation at its step, confirm nothing the run knew, or break a streak."""
    keys = ("step", "tokens", "targets", "updates", "metrics", "snapshot", "consumed")
    own = in_the_run(summary["phases"], summary["evaluations"])
    return [{k: e[k] for k in keys} for e in own]


def _spent(summary: dict[str, Any]) -> tuple[float, float]:
    """The (wall, device) seconds the run's budgets have counted: every phase but those
    of evaluations written after the fact (``eval_after``), which the run never waited
    for (a ``ledgerlm eval --harness`` of a killed run takes none of its budget)."""
    wall = device = 0.0
    for phase in summary["phases"]:
        if phase["kind"] != EVAL_AFTER:
            wall += phase["seconds"] or 0.0
            device += phase["device_seconds"]
    return wall, device


def _tasks_again(
    workspace: Workspace, summary: dict[str, Any], recipe: Recipe
) -> list[TaskSet] | None:
    """The recipe's tasks resolved again (files from the current directory, built-in
    ones from the run's data version), each the very file the run started with
    (``unchanged_tasks``); ``None`` when the run recorded no tasks yet (it died before
    its evaluation sets), to be resolved as a fresh run resolves them."""
    if events.latest(summary, events.TASKS) is None:
        return None
    run = summary["run"]
    data = find_version(workspace, "data", run["data_version"], verify=False)
    tokens = find_version(workspace, "tokens", run["tokens_version"], verify=False)
    sets = resolve_tasks(recipe.eval.tasks, workspace, TokenStore(tokens.path), data.path)
    unchanged_tasks(summary, sets)
    return sets


def resume_run(
    workspace: Workspace,
    run_ref: str,
    progress: Progress | None = None,
    world: World | None = None,
    restart: bool = False,
    callbacks: Sequence[Any] = (),
    rules: Sequence[StopRule] = (),
) -> RunResult:
    """Continue a killed or failed run from its last checkpoint, in the same ledger run.

    With ``restart`` (the only way for a run that stopped before its first checkpoint)
    it trains again from step 0, from the same seed, so it makes the same updates; the
    time already spent stays on the bill. Evaluations the run already recorded stay; a
    step evaluated again reuses its row when the weights digest matches (see
    ``ResumedEval``). ``callbacks`` are added to the trainer's and ``rules`` to its
    evaluator (``train.stopping``), one process only.
    """
    world, progress, handoff = prologue(world, progress, callbacks)
    if handoff is None:
        return follow(workspace, world)
    with handoff.guard():
        require_ledger(workspace.ledger_path)
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
            if not restart and not has_checkpoint(workspace, run_id):
                raise LedgerError(
                    f"run {run_id} stopped before its first checkpoint "
                    "(train.checkpoint_every = N saves one every N updates): it can only "
                    f"restart from step 0, in the same ledger run: ledgerlm resume {run_id} "
                    "--restart"
                )
            stored = load_recipe(run_dir / "recipe.toml")
            check_sinks(stored)  # before anything is written
            held = held_resources(world, stored, workspace)
            tasks = _tasks_again(workspace, before, stored)  # a changed file: refused here
        recorder = LedgerRecorder(ledger, run_id, note=progress.note)
        with handoff.guard(), run_lock(run_dir):
            # The killed process's open phases end at their last heartbeat (a lower bound
            # of what it spent); only now, under the lock, is no live process writing them.
            closed = ledger.close_open_phases(run_id, "resume")
            if closed:
                message = [{k: p[k] for k in ("id", "kind", "seconds")} for p in closed]
                ledger.add_event(run_id, events.CLOSED_OPEN_PHASES, json.dumps(message))
            ledger.finish_run(run_id, "running")
            # what this process holds, in force from its restore on (ledger.resources)
            ledger.add_event(run_id, events.RESOURCES, json.dumps(held))
            # The wall- and device-time budgets count the work recorded so far, not the
            # time between the kill and this resume, nor evaluations after the fact.
            spent = _spent(ledger.run_summary(run_id))
            started_at = time.time() - spent[0]
            with failing(recorder):
                ph = recorder.start("restore", resume=True, restart=restart)
                recipe = stored
                ledger.patience = recipe.log.ledger_timeout
                recorder.flush_every = max(1, recipe.eval.every_steps)
                open_sinks(recorder, recipe, run_dir)  # closed by failing(), however it ends
                world = placed(world, recipe.train)
                check_contract(recipe, world)
                if run["tokens_version"] is None and restart:  # it died before tokens
                    data, tokens, store = prepare_versions(recorder, recipe, workspace, progress)
                else:
                    data = find_version(workspace, "data", run["data_version"])
                    tokens = find_version(workspace, "tokens", run["tokens_version"])
                    store = TokenStore(tokens.path)
                    check_metric(recipe, store)  # as a fresh run checks it
                earlier = _earlier(before)
                start = None if restart else folder
                message = handoff_message(
                    run_id, data, tokens, recipe, folder, checkpoint=start, earlier=earlier
                )
                handoff.send(message)
                parts, saved = build_parts(recipe, store, world, start)
                step = saved["step"] if saved else 0
                ph.step_end = step
                cursor = saved["data"].get("cursor") or saved["data"].get("mix") if saved else None
                ph.detail.update(step=step, cursor=cursor)
                recorder.event(
                    events.RESUME, f"{'restart' if restart else 'from'} step {step}", step
                )
                if saved and saved.get("unwritten_steps"):  # a ledger locked past its timeout
                    ledger.add_steps(run_id, saved["unwritten_steps"])
                ranks = saved.get("ranks", 1) if saved else world.size
                training = same_global_batch(recipe, ranks, world)

                sets = eval_sets(recorder, store, recipe, workspace, data.path, tasks)
                evaluator = build_evaluator(
                    sets.val, recipe, store, earlier, saved, rules, ranks, tasks=sets.tasks
                )
                train_run(
                    recorder,
                    training,
                    parts,
                    evaluator,
                    world,
                    started_at=started_at,
                    progress=progress,
                    checkpoints=(folder, checkpoint_extra(run_id, recipe)),
                    test=sets.test,
                    resumed=saved["trainer"] if saved else None,
                    more=callbacks,
                    before=spent,
                )
        summary = ledger.run_summary(run_id)
    finally:
        ledger.close()
    params = parts.model.num_params()
    return RunResult(run_id, data, tokens, summary, sets.entropy, params)


def has_checkpoint(workspace: Workspace, run_id: str) -> bool:
    """Whether the run has a checkpoint to resume from."""
    return (resolve_checkpoint(workspace.run_dir(run_id) / "checkpoint") / STATE).is_file()


class PlanConflict(LedgerError):
    """A run a plan names that cannot be continued (another recipe, another process)."""


@dataclass
class Continued:
    """A run ``continue_run`` continued: ``how`` (started, resumed, restarted, reused),
    its versions, its summary as the ledger holds it now, and the wall time the ledger
    charged it before (so ``summary["total_seconds"] - seconds_before`` is this call's)."""

    run_id: str
    how: str
    data: BuiltVersion
    tokens: BuiltVersion
    summary: dict[str, Any]
    seconds_before: float = 0.0


def _planned_digest(recipe: Recipe, workspace: Workspace) -> str:
    """The digest of the recipe the ledger stores for a run of ``recipe`` (a search it
    names resolved, as ``run_recipe`` resolves it)."""
    return resolved_recipe(recipe, workspace).digest()


def continue_run(
    recipe: Recipe,
    workspace: Workspace,
    progress: Progress | None = None,
    *,
    callbacks: Sequence[Any] = (),
    restart: bool = False,
    rules: Sequence[StopRule] = (),
) -> Continued:
    """The run named ``recipe.name``, continued: ``reused`` when it finished, ``resumed``
    from its last checkpoint when it was interrupted or failed (``restarted`` from step 0
    in the same ledger run when it died before its first checkpoint, or always with
    ``restart``: for callbacks whose state no checkpoint keeps), ``started`` when the
    ledger holds no run of that name. A run found must have trained this very recipe
    (the same digest), and one that another process is training is refused
    (``PlanConflict``). ``rules`` may stop it early at an evaluation (a tuning trial's
    pruner, ``train.stopping``)."""
    found = None
    if workspace.ledger_path.is_file():
        with Ledger(workspace.ledger_path) as ledger:
            named = [r for r in ledger.list_runs() if r["name"] == recipe.name]  # newest first
            if named:
                found = next((r for r in named if r["status"] in FINISHED), named[0])
                before = ledger.run_summary(found["id"])
                stored = recipe_from_dict(before["run"]["recipe"])
    if found is None:
        result = run_recipe(recipe, workspace, progress, callbacks=callbacks, rules=rules)
        return Continued(result.run_id, "started", result.data, result.tokens, result.summary)
    run_id = found["id"]
    have, want = stored.digest(), _planned_digest(recipe, workspace)
    if have != want:
        raise PlanConflict(
            f"run {run_id} is named {recipe.name} but trained another recipe (sha256 "
            f"{have[:12]}, this one {want[:12]}): give the plan another name"
        )
    seconds = float(before["total_seconds"])
    if found["status"] in FINISHED:
        run = before["run"]
        data = find_version(workspace, "data", run["data_version"])
        tokens = find_version(workspace, "tokens", run["tokens_version"])
        return Continued(run_id, "reused", data, tokens, before, seconds)
    if found["status"] == "running" and not interrupted(workspace, found):
        raise PlanConflict(
            f"run {run_id} is being trained by another process: wait for it, or stop it "
            "and run this again"
        )
    restart = restart or not has_checkpoint(workspace, run_id)
    result = resume_run(
        workspace, run_id, progress, restart=restart, callbacks=callbacks, rules=rules
    )
    how = "restarted" if restart else "resumed"
    return Continued(run_id, how, result.data, result.tokens, result.summary, seconds)
