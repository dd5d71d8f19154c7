"""``ledgerlm``: the command line, a thin layer over the library."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ledgerlm.cli import (
    config_cmd,
    data_cmd,
    eval_cmd,
    export_cmd,
    ledger_cmd,
    lessons_cmd,
    mix_cmd,
    report_cmd,
    scale_cmd,
    tune_cmd,
)
from ledgerlm.cli.mix_cmd import print_plan
from ledgerlm.cli.recipes import shipped_recipe
from ledgerlm.cli.render import (
    continued_rows,
    continued_table,
    counters_table,
    evaluations_table,
    funnel_table,
    mixture_table,
    phase_table,
    print_searches,
    target_contract_line,
    target_line,
    task_tables,
    test_line,
)
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    NoVerifyOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    friendly_errors,
    load_recipe,
)
from ledgerlm.ledger.mixture import realised
from ledgerlm.workspace import Workspace

if TYPE_CHECKING:
    from ledgerlm.lab.run import RunResult

# The commands import the lab (and with it torch) when they run, not when the CLI loads:
# `ledgerlm --help` and the commands that only read the ledger start in a fraction of
# a second.

app = typer.Typer(
    name="ledgerlm",
    help="A pretraining lab that keeps an honest ledger: tokens, updates and the wall time "
    "of every phase until a quality target is confirmed on a fixed validation set.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from ledgerlm import __version__

        console.print(f"ledgerlm {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A pretraining lab that keeps an honest ledger: tokens, updates and the wall time of
    every phase until a quality target is confirmed on a fixed validation set."""


app.add_typer(config_cmd.app, name="config")
app.add_typer(data_cmd.app, name="data")
app.add_typer(ledger_cmd.app, name="ledger")
app.add_typer(export_cmd.app, name="export")
app.add_typer(scale_cmd.app, name="scale")
app.add_typer(mix_cmd.app, name="mix")
app.command("report")(report_cmd.report)
app.command("lessons")(lessons_cmd.lessons)
app.command("tune")(tune_cmd.tune)
app.command("eval")(eval_cmd.eval_run)


def _print_result(result: RunResult) -> None:
    s = result.summary
    console.print()
    console.print(funnel_table(result.data.manifest, result.tokens.manifest))
    console.print()
    console.print(counters_table(s))
    console.print()
    console.print(mixture_table(realised(s)))
    console.print()
    console.print(evaluations_table(s, limit=8))
    for table in task_tables(s, limit=8):  # the downstream tasks' curves
        console.print(table)
    console.print()
    console.print(phase_table(s))
    print_searches(s)  # the searches the recipe was chosen by, on its bill
    if found := continued_rows(s):
        console.print()
        console.print(continued_table(*found))
    console.print()
    console.print(f"run {escape(result.run_id)}: {result.params:,} parameters")
    console.print(escape(target_contract_line(s)))
    if line := test_line(s):
        console.print(escape(line))
    reached = s["time_to_target"]["reached"]
    console.print(f"[bold {'green' if reached else 'red'}]{escape(target_line(s))}[/]")


def _run(
    recipe_path: Path, workspace: Path, overrides: list[str] | None, verify: bool = True
) -> None:
    from ledgerlm.lab.run import process_started_at, run_recipe
    from ledgerlm.train.distributed import distributed_world

    recipe = load_recipe(recipe_path, overrides)
    with distributed_world() as world:
        if not world.is_main:  # under torchrun rank 0 reports; the others train quietly
            run_recipe(recipe, Workspace(workspace), world=world, verify=verify)
            return
        with RichProgress() as progress:
            result = run_recipe(
                recipe,
                Workspace(workspace),
                progress,
                world,
                on_plan=lambda planned: print_plan(planned.to_dict()),
                launched_at=process_started_at(),
                verify=verify,
            )
    _print_result(result)


@app.command()
@friendly_errors
def run(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file.")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    from_tune: Annotated[
        str | None,
        typer.Option(
            "--from-tune",
            help="Train the best trial of this finished tuning study of RECIPE (its name, "
            "a unique prefix or latest), the study charged to the run as a search phase: "
            "--set train.from_tune=STUDY.",
        ),
    ] = None,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Run a recipe end to end: prepare data, tokenize, train to the target, record it all.

    Data and tokens versions that exist are reused once checked against their manifests
    (files, sizes, counts, token ids, content hashes).

    Data-parallel on N processes (gloo on CPU, nccl on CUDA):
    torchrun --nproc-per-node N -m ledgerlm run RECIPE. Each optimizer update then
    covers N x grad_accum micro-batches, with one global loss denominator.

    A recipe chosen by a search carries it on its bill: --from-tune STUDY (a
    `ledgerlm tune` study) or --set data.mixture.from_search=ID (a `mix search`) adds a
    `search` phase with the search's wall and device time and its trials' table.
    """
    overrides = [*(set_ or []), *([f"train.from_tune={from_tune}"] if from_tune else [])]
    _run(recipe, workspace, overrides, verify=not no_verify)


@app.command()
@friendly_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file.")],
    init_from: Annotated[
        str | None,
        typer.Option(
            "--init-from",
            help="Continued pretraining: start from this run's final weights (id, unique "
            "prefix or latest); its tokenizer is reused.",
        ),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Train a recipe (data and tokens built or reused), optionally from another run.

    With --init-from the model starts from that run's final weights with a fresh
    optimizer and schedule, and is scored before and after on both validation sets:
    the new data's (gain) and the initial run's (forgetting), per domain.
    """
    overrides = [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])]
    _run(recipe, workspace, overrides, verify=not no_verify)


@app.command()
@friendly_errors
def resume(
    run: Annotated[
        str, typer.Argument(help="Run to continue: its id, a unique part of one, or latest.")
    ],
    workspace: WorkspaceOpt = DEFAULT_WS,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Train again from step 0 (same seed, same updates) instead of from the last "
            "checkpoint: the only way on for a run that stopped before its first one. The "
            "time already spent stays on the run's bill.",
        ),
    ] = False,
) -> None:
    """Continue a killed, failed or interrupted run from its last checkpoint, in the same
    ledger run.

    A run saves a checkpoint every N updates under --set train.checkpoint_every=N.

    The run is reopened as running, a restore phase records the load, and training
    goes on with the run's own recipe to max_steps or the target.

    On the same machine the final weights are bitwise those of an uninterrupted run.
    """
    from ledgerlm.lab.resume import resume_run
    from ledgerlm.train.distributed import distributed_world

    with distributed_world() as world:
        if not world.is_main:
            resume_run(Workspace(workspace), run, world=world, restart=restart)
            return
        with RichProgress() as progress:
            result = resume_run(Workspace(workspace), run, progress, world, restart=restart)
    _print_result(result)


@app.command()
@friendly_errors
def demo(
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
) -> None:
    """The whole pipeline on the built-in corpus (Python's own files), with the demo recipe."""
    _run(shipped_recipe("demo"), workspace, set_)
