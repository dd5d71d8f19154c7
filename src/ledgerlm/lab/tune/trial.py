"""One trial of a study: a ledger run of the base recipe with the trial's overrides.

The run is named ``<study>-tNN`` and continued (``lab.resume.continue_run``): a trial
whose process died resumes from its checkpoint in the same ledger run. After each
evaluation the pruner's rule (``PrunerRule``) reports the validation metric to the study
at the evaluation's step and stops the run as ``pruned`` when the pruner says so.

``run_trial`` is what a worker runs: a top-level function of plain data
(``TrialSpec``), which opens the study from its storage itself, so it runs the same in
this process, in a process pool or as a Ray task. It never raises for the trial's own
failure (a diverged loss, a recipe that does not fit): that is a ``failed`` result; an
exception out of it means the worker itself broke.

The value told to the study (both objectives are minimised):

- ``time``: a trial that reached the target gives its time-to-target in device-seconds;
  one that did not gives ``MISSED`` (1e9 device-seconds, some 32 device-years, beyond
  any trial) plus its final validation metric, so every trial that reached ranks before
  every one that did not, and those in the order of their final metric.
- ``metric``: the validation metric at the last evaluation (at the budget, or where
  the target was confirmed).

A pruned trial is told as Optuna's PRUNED and a failed one as FAIL (no value). A metric
that is better higher (a task's accuracy as the target) is told negated, to the pruner
and in both objectives, so minimising still means better.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ledgerlm.config import apply_overrides, recipe_from_dict
from ledgerlm.lab.tune.record import trial_name
from ledgerlm.ledger.target import higher_is_better, last_in_the_run
from ledgerlm.train.stopping import Stop

MISSED = 1e9


@dataclass(frozen=True)
class TrialSpec:
    """Everything a worker needs, as plain data (it is pickled to other processes)."""

    study: str
    storage: str  # ``lab.tune.study.storage_url``
    workspace: str
    number: int
    trial_id: int
    base: dict[str, Any]  # the base recipe's tree (``Recipe.to_dict``)
    overrides: list[str]
    params: dict[str, Any]
    objective: str
    pruner: dict[str, Any]
    attempt: int = 1
    quiet: bool = field(default=True, compare=False)

    @property
    def name(self) -> str:
        return trial_name(self.study, self.number)


class PrunerRule:
    """A ``train.stopping`` rule: report each evaluation's validation metric to the trial
    at its step, and stop the run as ``pruned`` when the pruner says so (never at the last
    step of the budget, where the run ends anyway with its own status)."""

    def __init__(self, trial: Any, pruner: str, metric: str, max_steps: int) -> None:
        self.trial, self.pruner, self.metric, self.max_steps = trial, pruner, metric, max_steps
        self.name = f"pruner:{pruner}"

    def __call__(self, record: Any, history: Any) -> Stop | None:
        step = int(record["step"])
        value = float(record["metrics"][self.metric])
        self.trial.report(told(self.metric, value), step)
        if step >= self.max_steps or not self.trial.should_prune():
            return None
        return Stop(
            reason=f"pruned by {self.pruner} at step {step}",
            status="pruned",
            detail={"pruner": self.pruner, "step": step, "value": value},
        )


def told(metric: str, value: float) -> float:
    """``value`` of ``metric`` as the study minimises it: negated when higher is better."""
    return -value if higher_is_better(metric) else value


def trial_recipe(spec: TrialSpec) -> Any:
    """The base recipe with the trial's overrides, named ``<study>-tNN``."""
    tree = apply_overrides(spec.base, spec.overrides)
    tree["name"] = spec.name
    return recipe_from_dict(tree, f"trial {spec.name}")


def final_metric(summary: dict[str, Any], metric: str) -> float | None:
    """The validation metric of the run's last evaluation (None before any)."""
    last = last_in_the_run(summary)
    if last is None:
        return None
    found = last["metrics"].get(metric)
    return None if found is None else float(found)


def time_to_target(summary: dict[str, Any]) -> tuple[float | None, str]:
    """The run's time-to-target in device-seconds (``summary["time_to_target"]
    ["device_seconds"]``), and ``"device"``; a run recorded before device time was
    recorded gives its wall seconds (x 1 device) and ``"wall"``. None when not reached."""
    verdict = summary.get("time_to_target") or {}
    if not verdict.get("reached"):
        return None, "device"
    if verdict.get("device_seconds") is not None:
        return float(verdict["device_seconds"]), "device"
    return float(verdict["seconds"]), "wall"


def device_seconds(summary: dict[str, Any]) -> float:
    """The run's device time (its wall seconds where the ledger has no device time)."""
    found = summary.get("device_seconds")
    return float(found if found is not None else summary.get("total_seconds") or 0.0)


def objective_value(objective: str, status: str, summary: dict[str, Any], metric: str) -> Any:
    """What the study is told of a finished run (see the module doc); None for a pruned
    or failed one."""
    last = final_metric(summary, metric)
    if status not in ("reached", "not reached") or last is None:
        return None
    if objective == "metric":
        return told(metric, last)
    seconds, _ = time_to_target(summary)
    if status == "reached" and seconds is not None:
        return seconds
    return MISSED + told(metric, last)


def _run_id(workspace: Any, name: str) -> str | None:
    from ledgerlm.ledger.store import Ledger

    if not workspace.ledger_path.is_file():
        return None
    with Ledger(workspace.ledger_path) as ledger:
        return next((r["id"] for r in ledger.list_runs() if r["name"] == name), None)


def result_row(spec: TrialSpec, summary: dict[str, Any] | None, error: str | None) -> dict:
    """The trial's row of the study's record (``record``'s trial fields) for a finished
    run's ``summary``, or a failed trial's ``error``."""
    row: dict[str, Any] = {
        "number": spec.number,
        "name": spec.name,
        "run": None,
        "status": "failed",
        "value": None,
        "params": dict(spec.params),
        "overrides": list(spec.overrides),
        "attempt": spec.attempt,
        "seconds": 0.0,
        "device_seconds": 0.0,
        "metric": None,
        "time_to_target": None,
        "time_unit": "device",
    }
    if summary is not None:
        status, metric = summary["run"]["status"], summary["run"]["target_metric"]
        seconds, unit = time_to_target(summary)
        row.update(
            run=summary["run"]["id"],
            status=status if status in ("reached", "not reached", "pruned") else "failed",
            seconds=float(summary.get("total_seconds") or 0.0),
            device_seconds=device_seconds(summary),
            metric=final_metric(summary, metric),
            time_to_target=seconds,
            time_unit=unit,
        )
        row["value"] = objective_value(spec.objective, row["status"], summary, metric)
    if error is not None:
        row.update(status="failed", value=None, error=error)
    return row


def run_trial(spec: TrialSpec, progress: Any = None) -> dict[str, Any]:
    """Train the trial (see the module doc) and give its record row, with ``how`` the
    run was continued (started, resumed, restarted, reused) and the worker's ``pid``."""
    import optuna

    from ledgerlm.lab.resume import continue_run
    from ledgerlm.lab.tune.study import make_pruner, open_storage, quiet_optuna
    from ledgerlm.ledger.store import Ledger
    from ledgerlm.workspace import Workspace

    started = time.perf_counter()
    workspace = Workspace(spec.workspace)
    quiet_optuna()
    study = optuna.load_study(
        study_name=spec.study,
        storage=open_storage(spec.storage),
        sampler=optuna.samplers.RandomSampler(),  # a worker samples nothing
        pruner=make_pruner(spec.pruner),
    )
    trial = optuna.trial.Trial(study, spec.trial_id)
    summary = error = how = None
    try:
        recipe = trial_recipe(spec)
        metric = recipe.eval.target()[0]
        rule = PrunerRule(trial, spec.pruner["kind"], metric, recipe.train.max_steps)
        run = continue_run(recipe, workspace, progress, rules=[rule])
        summary, how = run.summary, run.how
    except Exception as exc:  # the trial's own failure, kept on its row
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        if found := _run_id(workspace, spec.name):
            with Ledger(workspace.ledger_path) as ledger:
                summary = ledger.run_summary(found)
    row = result_row(spec, summary, error)
    row.update(how=how, pid=os.getpid(), worker_seconds=time.perf_counter() - started)
    return row
