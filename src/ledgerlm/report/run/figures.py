"""The run report's plotly figures: each run's target metric against wall time, tokens
and updates (one chart per unit), bits per byte against tokens, the per-update panels and
the phase times (the downstream tasks' figures: ``task_figures``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import finite
from ledgerlm.report.plots import (
    LEGEND,
    axis,
    figure,
    layout,
    lines,
    run_color,
    run_dash,
    t,
)
from ledgerlm.report.run.series import SMOOTHING, ema, eval_seconds, thin, tokens_per_second

PHASE_ORDER = (
    "startup",
    "setup",
    "search",
    "prep",
    "tokenize",
    "restore",
    "train",
    "eval",
    "checkpoint",
)
PHASE_COLORS = {
    "setup": "#d9d9d9",
    "prep": "#8dd3c7",
    "tokenize": "#80b1d3",
    "restore": "#bebada",
    "train": "#fdb462",
    "eval": "#fb8072",
    "checkpoint": "#b3de69",
}
OTHER_PHASE_COLORS = ("#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#ffffb3")
MISSED = "#b00"  # the cross on the bar of a run that missed its target
ID_WRAP = 20  # characters per line of a run id on the phase chart's axis

# Axis titles: a quantity and its unit (counts are their own unit).
WALL_TIME = "wall time (s)"
TOKENS = "tokens"
UPDATES = "optimizer updates"
BPB_UNIT = "bit/byte"
BPB = f"bits per byte ({BPB_UNIT})"
TRAIN_LOSS = "training loss (nat/token)"
LEARNING_RATE = "learning rate"
GRAD_NORM = "grad norm (L2)"
THROUGHPUT = "throughput (tokens/s)"
RUN = "run"


def sig(v: float | None) -> float | None:
    """``v`` to 6 significant digits: what a hover shows, in half the page bytes."""
    return None if v is None else float(f"{v:.6g}")


# ---------------------------------------------------------------------------- validation


def target_unit(summary: Mapping[str, Any]) -> str:
    run = summary["run"]
    contract = (run.get("meta") or {}).get("contract") or {}
    if contract.get("unit"):
        return str(contract["unit"])
    return BPB_UNIT if str(run["target_metric"]).startswith("bpb") else "nat/token"


def measure(metric: str) -> str:
    """A validation metric in words: ``bpb`` is bits per byte, ``loss/code`` the loss
    on code; a metric of another name is its name."""
    head, _, domain = metric.partition("/")
    if head == "task":  # task/<name>/<metric>: the task's metric
        return domain.replace("/", " ")
    words = {"bpb": "bits per byte", "loss": "loss"}.get(head, head)
    return f"{words} on {domain}" if domain else words


def unit_groups(summaries: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """The runs (their indices) by the unit of their target, in order of first
    appearance: a y axis holds one unit, so loss and bits per byte are drawn apart."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault(target_unit(s), []).append(i)
    return groups


def validation_title(summaries: Sequence[Mapping[str, Any]], runs: Sequence[int]) -> str:
    """What the validation charts of ``runs`` plot, with its unit: ``validation bits
    per byte (bit/byte)`` (raw text: escape it where it is placed)."""
    measures = dict.fromkeys(measure(str(summaries[i]["run"]["target_metric"])) for i in runs)
    units = dict.fromkeys(target_unit(summaries[i]) for i in runs)
    return f"validation {', '.join(measures)} ({', '.join(units)})"


def run_meta(summary: Mapping[str, Any], role: str) -> dict[str, str]:
    return {"run": t(summary["run"]["id"]), "role": role}


def _eval_trace(
    s: Mapping[str, Any], i: int, label: str, xs: Sequence[float | None], metric: str, unit: str
) -> dict[str, Any]:
    """One run's evaluations of ``metric`` against ``xs``; failed measurements are gaps."""
    evs = s.get("evaluations", [])
    ys = [finite((ev.get("metrics") or {}).get(metric)) for ev in evs]
    pts = [
        (x, y) if x is not None and y is not None else (None, None)
        for x, y in zip(xs, ys, strict=True)
    ]
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "x": [x for x, _ in pts],
        "y": [y for _, y in pts],
        "connectgaps": False,
        "name": lines(label),
        "legendgroup": f"run-{i}",
        "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
        "marker": {"size": 6},
        "customdata": [[ev.get("step"), ev.get("tokens")] for ev in evs],
        "meta": {**run_meta(s, "series"), "metric": t(metric), "unit": t(unit)},
        "hovertemplate": "%{meta.run}<br>step %{customdata[0]:,}, %{customdata[1]:,} tokens"
        "<br>%{meta.metric} %{y:.4f} %{meta.unit}",
    }


def target_lines(thresholds: Sequence[float], name: str = "target") -> list[dict[str, Any]]:
    """A dashed line across the plot at each threshold, each with its legend entry
    (``name`` and the value): a label on the line itself would sit outside the plot
    (and under the buttons) when the line is at the edge of the y range."""
    return [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": v,
            "y1": v,
            "line": {"color": "#000", "width": 1.5, "dash": "dash"},
            "name": f"{name} {v:g}",
            "showlegend": True,
        }
        for v in thresholds
    ]


def x_values(s: Mapping[str, Any], x: str) -> list[float | None]:
    if x == "seconds":
        return eval_seconds(s)
    return [finite(ev.get(x)) for ev in s.get("evaluations", [])]


def validation_figure(
    summaries: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    x: str,
    x_title: str,
    runs: Sequence[int] | None = None,
) -> Any:
    """The target metric of each of ``runs`` (indices into ``summaries``; all of them by
    default, sharing one unit) against ``x`` (``seconds``, ``tokens`` or ``updates``),
    the targets as dashed lines named in the legend, and a ring on each run's
    confirming evaluation."""
    runs = range(len(summaries)) if runs is None else runs
    data = []
    for i in runs:
        s, label = summaries[i], labels[i]
        xs = x_values(s, x)
        trace = _eval_trace(s, i, label, xs, s["run"]["target_metric"], target_unit(s))
        data.append(trace)
        confirming = s["time_to_target"].get("evaluation") or {}
        for j, ev in enumerate(s.get("evaluations", [])):
            if not confirming or ev.get("id") != confirming.get("id"):
                continue
            if trace["x"][j] is None or trace["y"][j] is None:
                continue
            ttt = s["time_to_target"]["seconds"]
            text = (
                f"{s['run']['id']}: target confirmed at step {ev.get('step')}, "
                f"{ev.get('tokens'):,} tokens, {ttt:,.1f} s"
            )
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "x": [trace["x"][j]],
                    "y": [trace["y"][j]],
                    "name": "target confirmed",
                    "legendgroup": f"run-{i}",
                    "showlegend": False,
                    "marker": {
                        "symbol": "circle-open",
                        "size": 16,
                        "color": run_color(i),
                        "line": {"width": 2.5, "color": run_color(i)},
                    },
                    "hovertext": [t(text)],
                    "hovertemplate": "%{hovertext}<extra></extra>",
                    "meta": run_meta(s, "confirm"),
                }
            )
    shapes = target_lines(sorted({float(summaries[i]["run"]["target_value"]) for i in runs}))
    return figure(
        data,
        layout(
            axis(x_title, rangemode="tozero"),
            axis(t(validation_title(summaries, runs))),
            log_toggle=True,
            shapes=shapes,
        ),
    )


def has_bpb(summaries: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any evaluation measured bits per byte."""
    return any(
        finite((ev.get("metrics") or {}).get("bpb")) is not None
        for s in summaries
        for ev in s.get("evaluations", [])
    )


def bpb_figure(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Any:
    """Validation bits per byte against tokens: comparable across tokenizers."""
    data = [
        _eval_trace(s, i, label, x_values(s, "tokens"), "bpb", BPB_UNIT)
        for i, (s, label) in enumerate(zip(summaries, labels, strict=True))
    ]
    return figure(data, layout(axis(TOKENS, rangemode="tozero"), axis(BPB), log_toggle=True))


# ---------------------------------------------------------------------------- per update

Series = Callable[[Sequence[Mapping[str, Any]]], tuple[list[int], list[float | None]]]


def _column(name: str) -> Series:
    def get(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float | None]]:
        return [int(r["step"]) for r in rows], [finite(r.get(name)) for r in rows]

    return get


# name, series, y axis title, unit in hover, hover format, smoothed, log switch
UPDATE_PANELS: tuple[tuple[str, Series, str, str, str, bool, bool], ...] = (
    ("train-loss", _column("loss"), TRAIN_LOSS, "nat/token", ".4f", True, True),
    ("lr", _column("lr"), LEARNING_RATE, "", ".4g", False, True),
    ("grad-norm", _column("grad_norm"), GRAD_NORM, "", ".4g", True, True),
    ("throughput", tokens_per_second, THROUGHPUT, "tokens/s", ",.0f", True, False),
)


def update_figure(
    summaries: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    steps: Mapping[str, Sequence[Mapping[str, Any]]],
    panel: tuple[str, Series, str, str, str, bool, bool],
) -> Any:
    """One per-update quantity against optimizer updates, per run: faint as recorded and,
    when ``smooth``, solid as its debiased moving average."""
    _, series, y_title, unit, fmt, smooth, log_toggle = panel
    data = []
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        xs, ys = series(steps.get(s["run"]["id"]) or [])
        if not xs:
            continue
        keep = thin(len(xs))
        hover = f"%{{meta.run}}<br>update %{{x:,}}<br>%{{y:{fmt}}} {unit}".rstrip()
        base = {
            "type": "scatter",
            "mode": "lines",
            "x": [xs[k] for k in keep],
            "legendgroup": f"run-{i}",
            "name": lines(label),
        }
        if smooth:
            data.append(
                {
                    **base,
                    "y": [sig(ys[k]) for k in keep],
                    "showlegend": False,
                    "opacity": 0.3,
                    "line": {"color": run_color(i), "width": 1, "dash": run_dash(i)},
                    "meta": run_meta(s, "raw"),
                    "hovertemplate": hover + " (raw)",
                }
            )
            smoothed = ema(ys)
            data.append(
                {
                    **base,
                    "y": [sig(smoothed[k]) for k in keep],
                    "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
                    "meta": run_meta(s, "smoothed"),
                    "hovertemplate": hover + f" (moving average, weight {SMOOTHING:g})",
                }
            )
        else:
            data.append(
                {
                    **base,
                    "y": [sig(ys[k]) for k in keep],
                    "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
                    "meta": run_meta(s, "value"),
                    "hovertemplate": hover,
                }
            )
    return figure(
        data,
        layout(
            axis(UPDATES, rangemode="tozero"),
            axis(y_title, exponentformat="e" if y_title == LEARNING_RATE else "B"),
            log_toggle=log_toggle,
        ),
    )


# ---------------------------------------------------------------------------- phases


def _phase_kinds(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = dict.fromkeys(k for s in summaries for k in s.get("phase_totals", {}))
    return [k for k in PHASE_ORDER if k in seen] + [k for k in seen if k not in PHASE_ORDER]


def _phase_color(kind: str, kinds: Sequence[str]) -> str:
    if kind in PHASE_COLORS:
        return PHASE_COLORS[kind]
    others = [k for k in kinds if k not in PHASE_COLORS]
    return OTHER_PHASE_COLORS[others.index(kind) % len(OTHER_PHASE_COLORS)]


def _marker_trace(
    name: str, rows: list[tuple[str, float]], role: str, marker: tuple[str, int, str], hover: str
) -> dict[str, Any]:
    """One marker per (run, seconds) on the phase chart, named in the legend."""
    symbol, size, color = marker
    return {
        "type": "scatter",
        "mode": "markers",
        "name": name,
        "y": [r for r, _ in rows],
        "x": [v for _, v in rows],
        "marker": {
            "symbol": symbol,
            "size": size,
            "color": color,
            "line": {"width": 3, "color": color},
        },
        "meta": {"role": role},
        "hovertemplate": hover,
    }


def phase_figure(summaries: Sequence[Mapping[str, Any]]) -> Any:
    """Stacked horizontal bars of phase seconds per run (one trace per phase kind); a
    tick marks time-to-target, and a cross at the end of its bar a run that missed its
    target. Run ids are wrapped onto lines of ``ID_WRAP`` characters."""
    kinds = _phase_kinds(summaries)
    ids = [t(s["run"]["id"]) for s in summaries]
    data: list[dict[str, Any]] = []
    for kind in kinds:
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": lines(kind),
                "y": ids,
                "x": [finite(s.get("phase_totals", {}).get(kind)) or 0.0 for s in summaries],
                "marker": {
                    "color": _phase_color(kind, kinds),
                    "line": {"color": "#fff", "width": 0.5},
                },
                "meta": {"role": "phase", "phase": t(kind)},
                "hovertemplate": "%{y}<br>%{meta.phase} %{x:,.1f} s<extra></extra>",
            }
        )
    reached = [
        (t(s["run"]["id"]), s["time_to_target"]["seconds"])
        for s in summaries
        if s["time_to_target"]["reached"] and s["time_to_target"]["seconds"] is not None
    ]
    if reached:
        data.append(
            _marker_trace(
                "time to target",
                reached,
                "ttt",
                ("line-ns-open", 26, "#000"),
                "%{y}<br>time to target %{x:,.1f} s<extra></extra>",
            )
        )
    # A legend entry, not a note beside the bar: a note there runs off a narrow figure.
    missed = [
        (t(s["run"]["id"]), sum(finite(v) or 0.0 for v in s.get("phase_totals", {}).values()))
        for s in summaries
        if not s["time_to_target"]["reached"]
    ]
    if missed:
        data.append(
            _marker_trace(
                "target not reached",
                missed,
                "missed",
                ("x-thin-open", 14, MISSED),
                "%{y}<br>target not reached in %{x:,.1f} s<extra></extra>",
            )
        )
    ticks = [lines(s["run"]["id"], ID_WRAP) for s in summaries]
    band = max(46, max(16 * tick.count("<br>") + 30 for tick in ticks))
    return figure(
        data,
        layout(
            axis(WALL_TIME, rangemode="tozero"),
            axis(RUN, autorange="reversed", type="category", tickvals=ids, ticktext=ticks),
            height=100 + band * len(summaries),  # and the legend's (see plots.figure)
            barmode="stack",
            legend={**LEGEND, "traceorder": "normal"},
        ),
    )
