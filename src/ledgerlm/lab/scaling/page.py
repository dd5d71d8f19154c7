"""A fit as a self-contained HTML page (``write_fit_report``), drawn by
``ledgerlm.report.scaling_report`` and written atomically."""

from __future__ import annotations

from pathlib import Path

from ledgerlm.lab.scaling.fit import Fit
from ledgerlm.workspace import atomic_write_text


def write_fit_report(path: str | Path, result: Fit) -> None:
    """The fit as a self-contained HTML page at ``path``, written atomically: loss against
    compute with the fitted frontier and its bootstrap band, isoFLOP curves when budgets
    repeat (the page says so when none does), residuals."""
    from ledgerlm.report.scaling_report import render_scaling_report
    from ledgerlm.scaling.fit import isoflop_fit

    path = Path(path)
    N, D, loss = result.used
    try:
        iso = isoflop_fit(N, D, loss, result.used.budget)
    except ValueError:  # no budget with enough points: the page says so
        iso = None
    title = f"ledgerlm scaling fit: {result.describe()}"
    page = render_scaling_report(N, D, loss, result.law, boot=result.boot, isoflop=iso, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, page)
