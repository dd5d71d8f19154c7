"""``ledgerlm report``: one self-contained, interactive HTML page over runs (curves,
per-update panels, phases, comparison)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ledgerlm.cli.ui import DEFAULT_WS, WorkspaceOpt, console, friendly_errors
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace, atomic_write_text


@friendly_errors
def report(
    runs: Annotated[
        list[str],
        typer.Argument(help="Runs (ids, unique parts, 'latest'); the first is the baseline."),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")] = Path(
        "report.html"
    ),
    workspace: WorkspaceOpt = DEFAULT_WS,
) -> None:
    """Write an HTML report: validation loss (and bits per byte) against wall time,
    tokens and updates, with the target and each run's confirming evaluation; the
    per-update training loss (raw and smoothed), learning rate, grad norm and tokens/s;
    phase times per run; the mixture; the comparison of `ledgerlm ledger compare`.
    Interactive charts (hover, zoom, log y), legends naming what differs between the
    recipes. One file: plotly.js is inlined, nothing is fetched.
    """
    from ledgerlm.report.run.page import render_report

    with Ledger(Workspace(workspace).ledger_path, read_only=True) as ledger:
        ids = list(dict.fromkeys(ledger.resolve_run(ref) for ref in runs))
        summaries = [ledger.run_summary(run_id) for run_id in ids]
        steps = {run_id: ledger.steps(run_id) for run_id in ids}
    page = render_report(summaries, steps)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, page)
    console.print(
        f"wrote {output} ({len(summaries)} run(s))", highlight=False, markup=False, soft_wrap=True
    )
