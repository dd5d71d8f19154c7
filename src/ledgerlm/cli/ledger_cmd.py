"""``ledgerlm ledger``: read runs back from ledger.db."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

from ledgerlm.cli.render import (
    counters_table,
    evaluations_table,
    phase_table,
    target_contract_line,
    target_line,
)
from ledgerlm.cli.ui import DEFAULT_WS, JsonOpt, WorkspaceOpt, console, friendly_errors
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

app = typer.Typer(help="Read runs back from the ledger (ledger.db).", no_args_is_help=True)


def _open(workspace) -> Ledger:
    path = Workspace(workspace).ledger_path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ledger here (run something first)")
    return Ledger(path)


@app.command("list")
@friendly_errors
def list_runs(workspace: WorkspaceOpt = DEFAULT_WS, as_json: JsonOpt = False) -> None:
    """List runs, newest first."""
    with _open(workspace) as ledger:
        runs = ledger.list_runs()
    if as_json:
        console.print_json(json.dumps(runs))
        return
    t = Table(show_edge=False)
    for col in ("run", "created", "status", "data", "tokens"):
        t.add_column(col)
    for r in runs:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        t.add_row(
            r["id"], created, r["status"], r["data_version"] or "-", r["tokens_version"] or "-"
        )
    console.print(t)


@app.command("show")
@friendly_errors
def show(
    run: Annotated[str, typer.Argument(help="Run id, a unique prefix, or 'latest'.")] = "latest",
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Phases with seconds, counters, every evaluation and the time-to-target of one run."""
    with _open(workspace) as ledger:
        summary = ledger.run_summary(ledger.resolve_run(run))
    if as_json:
        console.print_json(json.dumps(summary))
        return
    r = summary["run"]
    console.print(
        f"run {r['id']}  status: {r['status']}  data {r['data_version']}  "
        f"tokens {r['tokens_version']}"
    )
    console.print(counters_table(summary))
    console.print(evaluations_table(summary))
    console.print(phase_table(summary))
    console.print(target_contract_line(summary))
    console.print(target_line(summary))
