"""``ledgerlm tune``: a hyperparameter search with Optuna, every trial a ledger run."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    friendly_errors,
    load_recipe,
)

TUNE_FLAGS = {
    "param": "--param",
    "trials": "--trials",
    "sampler": "--sampler",
    "pruner": "--pruner",
    "objective": "--objective",
    "study": "--study",
}


@friendly_errors(flags=TUNE_FLAGS)
def tune(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file (every trial's base).")],
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="A searched key, section.key=KIND:SPEC (repeatable): log:LOW:HIGH (a float "
            "on a log scale), float:LOW:HIGH, int:LOW:HIGH[:STEP] or choice:A,B,C (each value "
            "a TOML literal), e.g. 'train.lr=log:1e-4:3e-2'. Checked against the recipe "
            "before anything runs.",
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(
            "--trials", min=1, help="Trials to run; with --sampler grid at most the grid's size."
        ),
    ] = 16,
    sampler: Annotated[
        str,
        typer.Option(
            "--sampler",
            help="tpe (Optuna's TPE, its first 10 trials random), random, or grid (every "
            "combination of the choice and int params, in an order fixed by the seed).",
        ),
    ] = "tpe",
    pruner: Annotated[
        str,
        typer.Option(
            "--pruner",
            help="asha (asynchronous successive halving: rungs from the first evaluation, a "
            "third promoted at each), median (a trial worse than the median of the finished "
            "ones at the same evaluation stops), or none. A stopped trial's run ends as "
            "pruned.",
        ),
    ] = "asha",
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="time: the trial's time-to-target in device-seconds, trials that miss the "
            "target ranked after those that reach it (by their final metric); metric: the "
            "validation metric at the last evaluation.",
        ),
    ] = "time",
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            min=1,
            help="Trials run at once. Locally each worker is a process sharing the cores "
            "(cores / K threads each); with --executor ray, the tasks in flight.",
        ),
    ] = 1,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            help="local (this machine) or ray (each trial a Ray task: pip install "
            "'ledgerlm[ray]').",
        ),
    ] = "local",
    trial_resources: Annotated[
        str | None,
        typer.Option(
            "--trial-resources",
            help="With --executor ray: a trial's resources, e.g. cpu=2,gpu=1.",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="With --executor ray: an existing cluster (ray://HOST:10001 or auto); "
            "default: a local Ray.",
        ),
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(
            "--study",
            help="The study's name (its trials are runs named <study>-tNN). Default: "
            "<recipe>-tune-<6 hex of its plan>, so the same command continues the same "
            "study; a name already used by another plan is refused.",
        ),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="Optuna's storage as an RDB URL (postgresql://..., mysql://...) that every "
            "worker reaches. Default: the journal file tune/<study>/journal.log of the "
            "workspace (on shared storage for a cluster). sqlite:/// serves one machine "
            "only, as Optuna advises.",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="The sampler's seed (default: the recipe's train.seed)."),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search a recipe's hyperparameters with Optuna (ask and tell).

    Every trial is a ledger run named <study>-tNN: the recipe with the trial's values
    as --set overrides. After each evaluation the trial reports its validation metric
    to the study, and the pruner may stop it (status pruned, apart from failed and not
    reached).

    The study lives in tune/<study>/ of the workspace (Optuna's storage and study.json,
    written before the first trial and as each ends) and survives a kill: the same
    command continues it, no finished trial runs again, and the interrupted one resumes
    from its checkpoint (or, without one, is marked failed and retried once). `ledgerlm
    run RECIPE --from-tune STUDY` trains the best trial's recipe with the study on its
    bill.
    """
    from ledgerlm.extras import check
    from ledgerlm.lab.tune.run import tune as run_study
    from ledgerlm.lab.tune.study import plan_study
    from ledgerlm.workspace import Workspace

    check("optuna", "ledgerlm tune")
    base = load_recipe(recipe, set_)
    spec = plan_study(
        base,
        list(param or []),
        trials=trials,
        sampler=sampler,
        pruner=pruner,
        objective=objective,
        seed=seed,
        study=study,
        storage=storage,
    )
    with RichProgress(lines=not as_json) as progress:
        record = run_study(
            spec,
            Workspace(workspace),
            progress,
            workers=workers,
            executor=executor,
            resources=trial_resources,
            ray_address=ray_address,
            on_trial=lambda row: progress.note(trial_line(row)),
        )
    if as_json:
        console.print_json(json.dumps(record))
        return
    print_study(record, recipe, list(set_ or []))


def _num(value: Any, fmt: str = ".4g") -> str:
    return "-" if value is None else format(value, fmt)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    return format(value, ".4g") if isinstance(value, float) else str(value)


def trial_line(row: dict[str, Any]) -> str:
    """One plain line per finished trial (escaped where shown)."""
    params = " ".join(f"{k}={_value(v)}" for k, v in row["params"].items())
    reached = row.get("time_to_target")
    what = f"to target {_num(reached, '.1f')} s" if reached is not None else ""
    metric = f"metric {_num(row.get('metric'))}"
    extra = f" ({row['error']})" if row.get("error") else ""
    retried = ", retried" if row.get("retried") else ""
    parts = [f"{row['name']}: {row['status']}{retried}", what, metric, params]
    return " ".join(p for p in parts if p) + extra


def print_study(record: dict[str, Any], recipe: Path, sets: Sequence[str] = ()) -> None:
    from ledgerlm.cli.table import FitTable

    t = FitTable(title=f"study {escape(record['study'])}", show_edge=False)
    for col in ("trial", "params", "status", "to target s", "metric", "device-h"):
        t.add_column(col, justify="left" if col in ("trial", "params", "status") else "right")
    for row in record["trials"]:
        label = f"t{row['number']:02d}" + (f" (try {row['attempt']})" if row["attempt"] > 1 else "")
        t.add_row(
            label,
            escape(" ".join(f"{k}={_value(v)}" for k, v in row["params"].items())),
            escape(row["status"]),
            _num(row.get("time_to_target"), ".1f"),
            _num(row.get("metric")),
            _num(float(row.get("device_seconds") or 0.0) / 3600, ".5f"),
        )
    console.print(t)
    units = {row.get("time_unit", "device") for row in record["trials"]}
    wall = " (wall seconds x 1 where a run has no device time)" if "wall" in units else ""
    console.print(f"to target: time-to-target in device-seconds{wall}", style="dim")
    hours = float(record.get("device_seconds") or 0.0) / 3600
    console.print(
        f"{len(record['trials'])} trials in {record['seconds']:.1f} s wall, "
        f"{hours:.5f} device-hours" + ("" if record.get("complete") else " (not complete)"),
        highlight=False,
    )
    best = record.get("best")
    if best is None:
        console.print("no trial finished with a value", highlight=False)
        return
    outcome = (
        f"value {best['value']:.6g}"
        if best.get("status") != "not reached"
        else f"target not reached, final metric {_num(best.get('metric'))}"
    )
    console.print(
        f"best: t{best['number']:02d} (run {escape(str(best['run']))}, {escape(outcome)})",
        highlight=False,
    )
    console.print(f"  {escape(' '.join(best['overrides']))}", highlight=False)
    console.print("train it with the study on its bill:", highlight=False)
    sets_args = [arg for one in sets for arg in ("--set", one)]
    command = ["ledgerlm", "run", str(recipe), *sets_args, "--from-tune", record["study"]]
    console.print(
        "  " + escape(shlex.join(command)),
        highlight=False,
    )
