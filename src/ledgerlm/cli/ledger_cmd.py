"""``ledgerlm ledger``: read runs back from ledger.db."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from typing import Annotated, Literal

import typer
from rich.markup import escape

from ledgerlm.cli.render import (
    after_line,
    continued_rows,
    continued_table,
    counters_table,
    coverage_lines,
    evaluations_table,
    mixture_table,
    phase_table,
    print_searches,
    resources_line,
    stop_line,
    target_contract_line,
    target_line,
    task_tables,
    test_line,
    warning_lines,
)
from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import DEFAULT_WS, JsonOpt, WorkspaceOpt, console, friendly_errors
from ledgerlm.lab.status import with_liveness
from ledgerlm.ledger.mixture import realised
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

app = typer.Typer(help="Read runs back from the ledger (ledger.db).", no_args_is_help=True)


def _open(workspace) -> Ledger:
    return Ledger(Workspace(workspace).ledger_path, read_only=True)


@app.command("list")
@friendly_errors
def list_runs(workspace: WorkspaceOpt = DEFAULT_WS, as_json: JsonOpt = False) -> None:
    """List runs, newest first."""
    with _open(workspace) as ledger:
        runs = with_liveness(Workspace(workspace), ledger.list_runs())
    if as_json:
        console.print_json(json.dumps(runs))
        return
    t = FitTable()
    # a run id is what the user copies into the next command: never wrapped (too long for
    # the console, it goes on a line of its own above its row)
    t.add_column("run", no_wrap=True)
    t.add_column("created", no_wrap=True)
    t.add_column("status")
    for col in ("data", "tokens"):
        t.add_column(col, no_wrap=True)
    for r in runs:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        status = r["status"]
        if status == "interrupted" and r.get("last_seen"):
            status += f" (last seen {time.strftime('%H:%M:%S', time.localtime(r['last_seen']))})"
        # versions by a 12-character prefix, which every command accepts
        data, tokens = ((v or "-")[:12] for v in (r["data_version"], r["tokens_version"]))
        cells = (r["id"], created, status, data, tokens)
        t.add_row(*map(escape, cells))
    console.print(t)


@app.command("show")
@friendly_errors
def show(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")] = "latest",
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Phases with seconds, counters, the mixture (configured weights beside the tokens
    consumed per domain), every evaluation (and each task metric with its standard
    error; those scored after the fact marked), the searches on its bill (each one's trials
    by how they ended, with their wall time and device-hours), the warnings (a sink that
    failed, a non-finite loss, ...) and the time-to-target of one run."""
    with _open(workspace) as ledger:
        summary = ledger.run_summary(ledger.resolve_run(run))
    (summary["run"],) = with_liveness(Workspace(workspace), [summary["run"]])
    summary["mixture"] = realised(summary)
    if as_json:
        console.print_json(json.dumps(summary))
        return
    r = summary["run"]
    console.print(
        escape(
            f"run {r['id']}  status: {r['status']}  data {r['data_version']}  "
            f"tokens {r['tokens_version']}"
        )
    )
    console.print(counters_table(summary))
    if rows := realised(summary):
        console.print(mixture_table(rows))
    console.print(evaluations_table(summary))
    for table in task_tables(summary):
        console.print(table)
    if line := after_line(summary):
        console.print(escape(line), highlight=False)
    console.print(phase_table(summary))
    for line in coverage_lines(summary):
        console.print(line, highlight=False)
    console.print(escape(resources_line(summary)), highlight=False)
    print_searches(summary)  # the searches on the run's bill
    if found := continued_rows(summary):
        console.print(continued_table(*found))
    for line in warning_lines(summary):
        console.print(escape(line), highlight=False, soft_wrap=True)
    console.print(escape(target_contract_line(summary)))
    if line := stop_line(summary):
        console.print(escape(line))
    if line := test_line(summary):
        console.print(escape(line))
    console.print(escape(target_line(summary)))


@app.command("steps")
@friendly_errors
def steps(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")] = "latest",
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="Print CSV (a header, a row per update).")
    ] = False,
) -> None:
    """The per-update series of one run: tokens, targets, loss, grad norm, learning rate,
    seconds and tokens per second of every optimizer update."""
    from ledgerlm.ledger.steps import throughput

    with _open(workspace) as ledger:
        run_id = ledger.resolve_run(run)
        rows = ledger.steps(run_id)
    for r in rows:
        r["tokens_per_second"] = throughput(r)
    if as_json:
        console.print_json(json.dumps({"run": run_id, "steps": rows}))
        return
    cols = ("step", "tokens", "targets", "loss", "grad_norm", "lr", "seconds", "tokens_per_second")
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(cols)
        writer.writerows([["" if r[c] is None else r[c] for c in cols] for r in rows])
        sys.stdout.write(out.getvalue())
        return
    t = FitTable(title=f"updates of {escape(run_id)}", show_edge=False)
    for col in cols:
        t.add_column(col.replace("_", " "), justify="right")
    for r in rows:
        t.add_row(
            str(r["step"]),
            f"{r['tokens']:,}",
            f"{r['targets']:,}",
            f"{r['loss']:.4f}",
            f"{r['grad_norm']:.3f}",
            f"{r['lr']:.2e}",
            "-" if r["seconds"] is None else f"{r['seconds']:.3f}",
            "-" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:,.0f}",
        )
    console.print(t)


@app.command("compare")
@friendly_errors
def compare(
    runs: Annotated[
        list[str],
        typer.Argument(help="Runs (ids, unique parts, 'latest'); the first is the baseline."),
    ],
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Compare runs with the first: execution speed-ups apart from recipe changes, seeds grouped.

    Per run: time-to-target, steps/tokens/updates to target, mean train step time and
    the share of prep, tokenize, eval and checkpoint time; a line when a run's validation
    loss improved but a task metric did not; runs that differ only by train.seed as mean,
    min-max, std of the time to target and of each final metric. The rule is printed
    with the table.
    """
    from ledgerlm.cli.render import device_hours, held_out_table, seed_metrics_table
    from ledgerlm.cli.ui import fmt_seconds
    from ledgerlm.ledger.compare import TABLE_COLUMNS, compare_runs, comparison_rows, seed_spread

    with _open(workspace) as ledger:
        ids = list(dict.fromkeys(ledger.resolve_run(ref) for ref in runs))
        result = compare_runs([ledger.run_summary(run_id) for run_id in ids])
    if as_json:
        console.print_json(json.dumps(result))
        return

    t = FitTable(title="time to target, against the first run", show_edge=False)
    device = result["resources_recorded"]  # device-hours shown once a run recorded them
    columns = list(TABLE_COLUMNS)
    if device:
        columns.insert(columns.index("time to target") + 1, "device-h")
    for col in columns:
        t.add_column(col, justify="left" if col in ("run", "vs baseline") else "right")
    for row in comparison_rows(result):
        if row["reached"]:
            ttt = fmt_seconds(row["time_to_target"])
        elif row["final_value"] is not None:  # how far it got
            ttt = f"[red]not reached[/] (final {row['final_value']:.4f})"
        else:
            ttt = "[red]not reached[/]"
        hours = (
            []
            if not device
            else ["-" if row["device_hours"] is None else device_hours(row["device_hours"])]
        )
        t.add_row(
            escape(row["run"]),
            escape(row["seed"]),
            ttt,
            *hours,
            *row["cells"],
            escape(row["verdict"]),
        )
    console.print(t)
    for c in result["comparisons"]:
        line = f"{escape(c['run'])}: [bold]{escape(c['class'])}[/], {escape(c['reason'])}"
        if c.get("seconds_delta") is not None:
            line += f"; {c['seconds_delta']:+,.1f} s to target"
        if device and c.get("seconds_ratio") and c.get("device_seconds_ratio"):
            line += (
                f" (x{c['seconds_ratio']:.2f} wall time, x{c['device_seconds_ratio']:.2f} "
                "device time)"
            )
        console.print(line, highlight=False)
        if c.get("wall_device"):
            console.print(f"    {escape(c['wall_device'])}", highlight=False)
        for diff in c["recipe_diff"][:8]:
            console.print(f"    {escape(diff)}", highlight=False)
        if len(c["recipe_diff"]) > 8:
            console.print(f"    ... {len(c['recipe_diff']) - 8} more", highlight=False)
        if c.get("final"):
            console.print(f"    {escape(c['final'])}", highlight=False)
        if line := c["task_check"]["line"]:
            console.print(f"    [yellow]{escape(line)}[/]", highlight=False)
        if deltas := [d for d in c["domains"] if d["delta"] is not None]:
            cells = ", ".join(f"{d['domain']} {d['delta']:+.4f}" for d in deltas)
            console.print(
                f"    final val loss by domain vs baseline: {escape(cells)}", highlight=False
            )
    for g in result["seed_groups"]:
        if g["n"] < 2:
            continue
        console.print(
            f"seed group {escape(str(g['group']))}: {g['n']} runs, seeds "
            f"{escape(', '.join(map(str, g['seeds'])))}, reached {g['n_reached']}/{g['n']}; "
            f"{seed_spread(g)}",
            highlight=False,
        )
    if table := seed_metrics_table(result["seed_groups"]):
        console.print(table)
    held = result["held_out"]
    if any(r["test"] is not None for r in held["rows"]):
        console.print(held_out_table(held))
    if held["warning"]:
        console.print(f"[yellow]{escape(held['warning'])}[/]", highlight=False)
    console.print(escape(result["final_figure"]), highlight=False)
    console.print(f"[dim]rule: {escape(result['rule'])}[/]", highlight=False)
    if device:
        console.print(f"[dim]{escape(result['device_rule'])}[/]", highlight=False)


@app.command("export")
@friendly_errors
def export(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")],
    dest: Annotated[
        str | None,
        typer.Argument(
            help="tensorboard: folder (event files go to DEST/<run id>); mlflow: tracking "
            "URI (default: the recipe's log.mlflow_uri, else MLFLOW_TRACKING_URI); wandb: "
            "folder for W&B's files (default: the run's log folder)."
        ),
    ] = None,
    to: Annotated[
        Literal["tensorboard", "mlflow", "wandb"],
        typer.Option("--to", help="The sink to copy the run into."),
    ] = "tensorboard",
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Replay a run from the ledger (recipe, every update, every evaluation) into
    TensorBoard, MLflow or W&B: ledger export RUN --to tensorboard DIR.

    Needs the sink's library: ledgerlm's extras tensorboard, mlflow and wandb install them."""
    from ledgerlm.lab.sinks import replay_to_sinks

    with _open(workspace) as ledger:
        result = replay_to_sinks(ledger, Workspace(workspace), run, to, dest)
    if as_json:
        console.print_json(json.dumps(result))
        return
    line = (
        f"{result['where']}: {result['steps']} updates and {result['evaluations']} "
        f"evaluations of run {result['run']} ({result['status']}) in {to}"
    )
    console.print(line, highlight=False, markup=False, soft_wrap=True)
    if result["view"]:  # the command that shows the copy
        console.print(result["view"], highlight=False, markup=False, soft_wrap=True)


@app.command("export-mllog")
@friendly_errors
def export_mllog_cmd(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")] = "latest",
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="File to write (default: runs/<run-id>/mllog.txt)."),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check", help="Run mlperf_logging's compliance checker on it; exit 1 if it fails."
        ),
    ] = False,
    workspace: WorkspaceOpt = DEFAULT_WS,
) -> None:
    """Write one run as MLPerf MLLOG lines, timed from the ledger (needs mlperf-logging)."""
    from pathlib import Path

    from ledgerlm.report.mllog import RULES, check_mllog, export_mllog

    with _open(workspace) as ledger:
        summary = ledger.run_summary(ledger.resolve_run(run))
    run_id = summary["run"]["id"]
    path = export_mllog(
        summary, Path(output) if output else Workspace(workspace).run_dir(run_id) / "mllog.txt"
    )
    status = "success" if summary["time_to_target"]["reached"] else "aborted"
    line = f"{path}: MLLOG of run {run_id}, run_stop status {status}"
    console.print(line, highlight=False, markup=False, soft_wrap=True)
    if not check:
        console.print(
            f"check: python -m mlperf_logging.compliance_checker --werror --config {RULES} {path}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return
    failures = check_mllog(path)
    for failure in failures:
        typer.echo(failure, err=True)
    if failures:
        typer.echo(f"compliance check FAILED ({len(failures)} problems)", err=True)
        raise typer.Exit(1)
    console.print(f"compliance check passed ({RULES.name})", highlight=False)
