"""The run report's figures of downstream tasks: each task metric of every run against
tokens and the ledger's wall time, with its 95% interval as error bars, the evaluations
written after the fact apart, and the thresholds of the runs' task targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import finite
from ledgerlm.ledger.compare_tasks import after_the_fact, task_metric_names
from ledgerlm.ledger.target import higher_is_better, target_key
from ledgerlm.report.plots import axis, figure, layout, lines, run_color, run_dash, t
from ledgerlm.report.run.figures import BPB_UNIT, run_meta, sig, target_lines, x_values

SHARE_OF_ITEMS = "fraction of items"  # the unit of an accuracy


TITLE_NAME = 16  # characters of a task's name in an axis title, which runs the height


def task_title(metric: str, cut: int | None = None) -> str:
    """A task metric's title with its unit: ``arith exact_match (fraction of items)``,
    ``story bits per byte (bit/byte)``; with ``cut``, a longer name cut to that many
    characters (an axis title runs the figure's height; the heading keeps the name
    whole). Raw text: escape it where placed."""
    _, name, what = metric.split("/")
    if cut is not None and len(name) > cut:
        name = name[: cut - 1] + "…"
    if what == "bpb":
        return f"{name} bits per byte ({BPB_UNIT})"
    return f"{name} {what} ({SHARE_OF_ITEMS})"


def task_threshold(summary: Mapping[str, Any]) -> dict[str, float]:
    """The task metrics the run's target contract holds a threshold for."""
    run = summary["run"]
    contract = (run.get("meta") or {}).get("contract") or {}
    found = {target_key(k): float(v) for k, v in (contract.get("targets") or {}).items()}
    if str(run["target_metric"]).startswith("task/"):
        found[run["target_metric"]] = float(run["target_value"])
    return {k: v for k, v in found.items() if k.startswith("task/")}


def all_task_metrics(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every task metric any run's evaluations hold, in the order first seen."""
    return list(dict.fromkeys(k for s in summaries for k in task_metric_names(s["evaluations"])))


def _task_trace(
    s: Mapping[str, Any], i: int, label: str, metric: str, x: str, later: bool
) -> dict[str, Any] | None:
    """One run's ``metric`` with its 95% interval as error bars: its evaluations in the
    loop (``later`` False), or those written after the fact (hollow markers, never on
    the wall-time axis: the run's clock had stopped)."""
    after = after_the_fact(s)
    xs = x_values(s, x)
    pts = []
    for ev, xv in zip(s.get("evaluations", []), xs, strict=True):
        m = ev.get("metrics") or {}
        value = finite(m.get(metric))
        if value is None or xv is None or (ev.get("id") in after) != later:
            continue
        low, high = finite(m.get(f"{metric}_low")), finite(m.get(f"{metric}_high"))
        pts.append((xv, value, low, high, ev, m))
    if not pts or (later and x == "seconds"):
        return None
    unit = BPB_UNIT if metric.endswith("/bpb") else ""
    return {
        "type": "scatter",
        "mode": "markers" if later else "lines+markers",
        "x": [p[0] for p in pts],
        "y": [sig(p[1]) for p in pts],
        "error_y": {
            "type": "data",
            "symmetric": False,
            "array": [None if p[3] is None else sig(p[3] - p[1]) for p in pts],
            "arrayminus": [None if p[2] is None else sig(p[1] - p[2]) for p in pts],
            "color": run_color(i),
            "thickness": 1.5,
            "width": 4,
        },
        "name": lines(label if not later else f"{label}, after the fact"),
        "legendgroup": f"run-{i}",
        "showlegend": not later,
        "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
        "marker": {"size": 9 if later else 6, "symbol": "diamond-open" if later else "circle"},
        "customdata": [
            [
                p[4].get("step"),
                p[4].get("tokens"),
                p[2],
                p[3],
                finite(p[5].get(f"{metric}_stderr")),
                finite(p[5].get(f"task/{metric.split('/')[1]}/items")),
            ]
            for p in pts
        ],
        "meta": {
            **run_meta(s, "task-after" if later else "task"),
            "metric": t(metric),
            "unit": t(unit),
            "when": "scored after the fact" if later else "in the loop",
        },
        "hovertemplate": "%{meta.run}<br>step %{customdata[0]:,}, %{customdata[1]:,} tokens, "
        "%{meta.when}<br>%{meta.metric} %{y:.4f} %{meta.unit} ± %{customdata[4]:.4f}"
        "<br>95% interval %{customdata[2]:.4f} to %{customdata[3]:.4f} over "
        "%{customdata[5]:,} items<extra></extra>",
    }


def task_figure(
    summaries: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    metric: str,
    x: str,
    x_title: str,
) -> Any:
    """One task metric of every run against ``x`` (``tokens`` or ``seconds``), its 95%
    interval as error bars (Wilson for an accuracy, bootstrap for bits per byte),
    evaluations written after the fact as hollow diamonds (against tokens), and each
    threshold a run's target holds for it as a dashed line named with its direction."""
    data = []
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        for later in (False, True):
            if (trace := _task_trace(s, i, label, metric, x, later)) is not None:
                data.append(trace)
    sign = ">=" if higher_is_better(metric) else "<="
    thresholds = sorted({v for s in summaries for k, v in task_threshold(s).items() if k == metric})
    shapes = target_lines(thresholds, f"target {sign}")
    return figure(
        data,
        layout(
            axis(x_title, rangemode="tozero"),
            axis(t(task_title(metric, TITLE_NAME))),
            shapes=shapes,
        ),
    )
