"""``ledgerlm report``: one self-contained HTML page over runs (curves, phases, comparison)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ledgerlm.cli.ui import DEFAULT_WS, WorkspaceOpt, console, friendly_errors
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace


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
    """Write an HTML report: validation loss against wall time, tokens and updates, the
    target and each run's confirming evaluation, phase times per run, and the comparison
    of `ledgerlm ledger compare`. One file, inline SVG, no scripts or external resources.
    """
    from ledgerlm.report.run_report import render_report

    path = Workspace(workspace).ledger_path
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no ledger here (run something first)")
    with Ledger(path) as ledger:
        ids = list(dict.fromkeys(ledger.resolve_run(ref) for ref in runs))
        summaries = [ledger.run_summary(run_id) for run_id in ids]
    page = render_report(summaries)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(page, encoding="utf-8")
    console.print(
        f"wrote {output} ({len(summaries)} run(s))", highlight=False, markup=False, soft_wrap=True
    )
