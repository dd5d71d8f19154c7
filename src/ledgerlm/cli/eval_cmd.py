"""``ledgerlm eval``: score a finished run's snapshot on downstream tasks after the fact."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    RichProgress,
    WorkspaceOpt,
    console,
    fmt_seconds,
    friendly_errors,
)
from ledgerlm.workspace import Workspace

if TYPE_CHECKING:
    from ledgerlm.lab.evaluate_run import AfterEval

EVAL_FLAGS = {"step": "--step", "tasks": "--tasks", "limit": "--limit"}


@friendly_errors(flags=EVAL_FLAGS)
def eval_run(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")],
    step: Annotated[
        int | None,
        typer.Option(
            "--step",
            help="The snapshot to score: the step of the run's checkpoint (a run keeps its "
            "latest only), which is the default.",
        ),
    ] = None,
    tasks: Annotated[
        list[str] | None,
        typer.Option(
            "--tasks",
            metavar="FILE|NAME",
            help="A TOML file of [[tasks]] tables (as [[eval.tasks]] in a recipe; task "
            "files read from the current directory) or the name of one of the run's "
            "eval.tasks; repeatable. Default: every task of the run.",
        ),
    ] = None,
    harness: Annotated[
        bool,
        typer.Option(
            "--harness",
            help="Score with lm-evaluation-harness (pip install 'ledgerlm[lmeval]') on the "
            "snapshot exported as a Hugging Face model, offline, on the same items.",
        ),
    ] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Score at most the first N items of each task.")
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
) -> None:
    """Score a run's checkpoint on downstream tasks and record it in the ledger.

    In this process on the CPU, with the run's numerics, or with lm-evaluation-harness
    (--harness). The result is an evaluation of that snapshot (its step, tokens and
    weights digest) bound to an eval_after phase holding its seconds: it never confirms
    the run's target, is not on its bill, and the run's status stays as it was. A run
    being trained is refused.
    """
    from ledgerlm.lab.evaluate_run import evaluate_run

    with RichProgress() as progress:
        result = evaluate_run(
            Workspace(workspace),
            run,
            step=step,
            tasks=tasks or (),
            harness=harness,
            limit=limit,
            progress=progress,
        )
    console.print(metrics_table(result))
    how = "by lm-evaluation-harness" if result.harness else "in process"
    console.print(
        f"run {escape(result.run_id)} at step {result.step} (snapshot {result.snapshot}), "
        f"scored {how} in {fmt_seconds(result.seconds)}: evaluation {result.evaluation_id} "
        "in the ledger, an eval_after phase",
        highlight=False,
    )
    if result.loop_snapshot:
        console.print("the run's own evaluation at this step scored the same weights")


def _cell(metrics: dict[str, float], key: str) -> str:
    value = metrics.get(key)
    return "-" if value is None or value != value else f"{value:.4f}"


def metrics_table(result: AfterEval) -> FitTable:
    """One row per task metric: value, standard error, 95% interval, items, seconds."""
    t = FitTable(title="tasks")
    for header in ("task", "metric", "value", "stderr", "95% interval", "items", "seconds"):
        t.add_column(header, justify="left" if header in ("task", "metric") else "right")
    m = result.metrics
    for name in result.tasks:
        prefix = f"task/{name}/"
        metrics = [k.removeprefix(prefix) for k in m if k.startswith(prefix)]
        values = [k for k in metrics if f"{prefix}{k}_stderr" in m]
        items = m.get(f"{prefix}items")
        for i, metric in enumerate(values):
            key = prefix + metric
            interval = f"{_cell(m, key + '_low')}-{_cell(m, key + '_high')}"
            t.add_row(
                escape(name) if i == 0 else "",
                metric,
                _cell(m, key),
                _cell(m, key + "_stderr"),
                interval,
                f"{items:,.0f}" if i == 0 and items is not None else "",
                fmt_seconds(result.task_seconds.get(name)) if i == 0 else "",
            )
    return t
