"""The run report's page: the runs listed with their verdicts, then the figures and
tables in order."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import compare_runs, finite
from ledgerlm.ledger.target import higher_is_better, last_in_the_run
from ledgerlm.report.plots import e, figure_html, page
from ledgerlm.report.run.figures import (
    BPB_UNIT,
    TOKENS,
    UPDATE_PANELS,
    UPDATES,
    WALL_TIME,
    bpb_figure,
    has_bpb,
    phase_figure,
    target_unit,
    unit_groups,
    update_figure,
    validation_figure,
    validation_title,
)
from ledgerlm.report.run.labels import recipe_labels
from ledgerlm.report.run.series import MAX_POINTS, SMOOTHING
from ledgerlm.report.run.tables import comparison_html, mixture_html, search_html, swatch
from ledgerlm.report.run.task_figures import all_task_metrics, task_figure, task_title


def _run_list(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    items = []
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        r, ttt = s["run"], s["time_to_target"]
        verdict = (
            f"target reached at step {ttt['step']} after {ttt['seconds']:,.1f} s"
            if ttt["reached"]
            else "target NOT reached"
        )
        verdict += device_words(s)
        last = (last_in_the_run(s) or {}).get("metrics") or {}
        if finite(last.get("bpb")) is not None:  # comparable across tokenizers
            verdict += f"; final validation {last['bpb']:.4f} bits per byte"
        metric = str(r["target_metric"])
        target = (
            f"{'' if metric.startswith('task/') else 'val '}{metric} "
            f"{'>=' if higher_is_better(metric) else '<='} {r['target_value']:g} {target_unit(s)}"
        )
        items.append(
            f"<li>{swatch(i)}<b>{e(r['id'])}</b> [{e(label)}] (recipe {e(r.get('name'))}, "
            f"status {e(r.get('status'))}): {e(target)}; {e(verdict)}</li>"
        )
    return f"<ul class='runs'>{''.join(items)}</ul>"


def device_words(s: Mapping[str, Any]) -> str:
    """The device time of a run's bill and what it held (``ledger.resources``)."""
    ttt, held = s["time_to_target"], s.get("resources")
    hours = ttt.get("device_hours") if ttt["reached"] else None
    if hours is None:
        hours = finite(s.get("device_seconds"))
        hours = None if hours is None else hours / 3600
        what = "device-hours in all"
    else:
        what = "device-hours to target"
    words = "" if hours is None else f", {hours:.3g} {what}"
    if held:
        words += f" on {held['devices']} x {held['device_kind']} ({held['device_name']})"
    else:
        words += " (resources not recorded: 1 device)"
    cost = ttt.get("cost") if ttt["reached"] else None
    if cost:
        words += f", cost {cost['amount']:,.4g} at {cost['currency_per_device_hour']:g}/device-hour"
    return words


def task_sections(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> list[str]:
    """Each downstream task metric against tokens and wall time; none without tasks."""
    metrics = all_task_metrics(summaries)
    if not metrics:
        return []
    out = [
        "<h2>Downstream tasks</h2><p>Each task metric at each evaluation, its bar the 95% "
        "interval (Wilson's for an accuracy, a bootstrap over items for bits per byte); a "
        "dashed line is a task target, named with its direction. Hollow diamonds are "
        "evaluations written after the fact (<code>ledgerlm eval</code>): drawn against "
        "tokens only, since the run's clock had stopped.</p>"
    ]
    for k, metric in enumerate(metrics):
        title = task_title(metric)
        for x, x_title, heading in (
            ("tokens", TOKENS, "tokens seen"),
            ("seconds", WALL_TIME, "wall time (all phases up to the evaluation)"),
        ):
            fig = task_figure(summaries, labels, metric, x, x_title)
            out.append(
                f"<h3>{e(title)} against {e(heading)}</h3>" + figure_html(f"task-{k}-{x}", fig)
            )
    return out


def render_report(
    summaries: list[dict],
    steps: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> str:
    """The whole report page for ``summaries`` (``Ledger.run_summary`` dicts), as HTML.

    ``steps``: per run id, its per-update rows (``Ledger.steps``) for the training loss,
    learning rate, grad norm and throughput panels; without them the page says so."""
    if not summaries:
        raise ValueError("a report needs at least one run")
    steps = steps or {}
    result = compare_runs(summaries)
    labels = recipe_labels(summaries)
    sections = [
        "<p>Each evaluation is a point; the dashed black line is the target; a ring marks "
        "the evaluation that first confirmed it (time-to-target ends there). Legend labels "
        "name the recipe keys that differ between the runs; hover a point for its run id, "
        "drag to zoom (double-click resets), click a legend entry to hide a run. The first "
        "run is the baseline of the comparison.</p>",
        _run_list(summaries, labels),
    ]
    charts = (
        ("seconds", WALL_TIME, "wall time (all phases up to the evaluation)"),
        ("tokens", TOKENS, "tokens seen"),
        ("updates", UPDATES, "optimizer updates"),
    )
    for k, (unit, runs) in enumerate(unit_groups(summaries).items()):
        title = validation_title(summaries, runs)
        suffix = "" if k == 0 else "-" + re.sub(r"[^a-z0-9]+", "-", unit.lower()).strip("-")
        for x, x_title, heading in charts:
            fig = validation_figure(summaries, labels, x, x_title, runs)
            sections.append(
                f"<h2>{e(title[0].upper() + title[1:])} against {e(heading)}</h2>"
                + figure_html(f"val-{x}{suffix}", fig)
            )
    # The bits per byte of every run, unless the charts above drew just that already.
    if has_bpb(summaries) and any(s["run"]["target_metric"] != "bpb" for s in summaries):
        sections.append(
            f"<h2>Validation bits per byte ({BPB_UNIT}) against tokens seen</h2>"
            + figure_html("bpb-tokens", bpb_figure(summaries, labels))
        )
    sections += task_sections(summaries, labels)
    sections.append("<h2>Training, per optimizer update</h2>")
    if any(steps.get(s["run"]["id"]) for s in summaries):
        longest = max(len(steps.get(s["run"]["id"]) or []) for s in summaries)
        thinned = (
            f" Runs with more than {MAX_POINTS:,} updates are drawn from {MAX_POINTS:,} "
            "evenly spaced updates; the average runs over all of them."
            if longest > MAX_POINTS
            else ""
        )
        sections.append(
            "<p>Faint lines are the values recorded at each update, solid lines their "
            f"exponential moving average (weight {SMOOTHING:g}, debiased at the start, as "
            "TensorBoard smooths). The grad norm is the L2 norm before clipping; throughput "
            f"is each update's tokens over its wall seconds.{thinned}</p>"
        )
        for panel in UPDATE_PANELS:
            sections.append(figure_html(panel[0], update_figure(summaries, labels, steps, panel)))
    else:
        sections.append('<p class="note">No per-update rows were given for these runs.</p>')
    sections += [
        "<h2>Time per phase</h2>",
        figure_html("phases", phase_figure(summaries)),
        search_html(summaries),
        mixture_html(summaries),
        "<h2>Comparison</h2>",
        comparison_html(result),
    ]
    title = f"ledgerlm report: {len(summaries)} run(s)"
    return page(title, f"<h1>{e(title)}</h1>{''.join(sections)}")
