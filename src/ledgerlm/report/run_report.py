"""A self-contained, interactive HTML report over runs: curves, phase times, comparison.

The figures are plotly (drawn with ``plots.py``, shared with the scaling report), on one
page that inlines plotly.js once and fetches nothing, so it opens offline and can be
archived beside the ledger:

- each run's target metric (the loss in nat/token, or bits per byte with
  ``eval.target_bpb``) against the ledger's wall time, tokens and optimizer updates,
  with the target as a dashed line and a ring on the evaluation that confirmed it; the
  headings and axes say which measure and unit, and runs whose targets have different
  units get charts of their own (one y axis, one unit). Then bits per byte against
  tokens when the evaluations measured ``bpb``, unless every target was ``bpb``
  (the charts above drew exactly that);
- per optimizer update (the ``Ledger.steps`` rows): the training loss, faint as recorded
  and solid as its exponential moving average (TensorBoard's smoothing, weight
  ``SMOOTHING``, debiased so the first updates are not pulled towards 0), the learning
  rate, the gradient's L2 norm before clipping and the throughput (the update's tokens
  over its wall seconds; rows without seconds are left out);
- the phase times per run, stacked, with a tick at time-to-target and a cross at the
  end of the bar of a run that missed its target.

Then the mixture table and the comparison of ``ledger compare``. Every axis names its
quantity and unit; the loss and learning-rate panels have a linear/log switch. The
figures read at a 400 px window as at 1,400: legends along the bottom edge, their long
labels and the run ids wrapped (``plots.lines``), the figure taller by what its legend
takes; no text placed outside the plot (a target is named in the legend, not on its
line). With several runs, a run's
legend label is the recipe keys whose values differ between the runs (``train.lr=0.01,
model.d_model=64``, see :func:`recipe_labels`); its id is in every hover. Per-update
series longer than ``MAX_POINTS`` are drawn from evenly spaced updates (the average
runs over all of them), so a long run does not make the page heavy.

Every piece of text that comes from the ledger (run ids and names, metric names, phase
kinds, recipe values) is escaped: ``html.escape`` in the HTML, and ``plots.t`` in plotly
text, which reads some HTML tags. A run may be named ``<script>``.

The time axis is the ledger's own clock: at each evaluation, the summed wall time of
every phase recorded up to and including that evaluation's phase. That is the sum
time-to-target is made of, so each run's confirming evaluation sits exactly at its
time-to-target, and time a killed run spent waiting to be resumed is not drawn as work.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import compare_runs, final_domain_losses
from ledgerlm.ledger.mixture import realised
from ledgerlm.report.plots import (
    LEGEND,
    axis,
    e,
    figure,
    figure_html,
    layout,
    lines,
    page,
    run_color,
    run_dash,
    t,
)

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
SMOOTHING = 0.9  # weight of the past in the moving average of per-update series
MAX_POINTS = 2000  # per-update points drawn per series
LABEL_KEYS = 4  # recipe differences named in a legend label (the rest are counted)
LABEL_VALUE_CHARS = 40
# Recipe sections that say where a run logs, not what it learned: never a difference.
IGNORED_SECTIONS = ("log",)
_UNSET = object()

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


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def eval_seconds(summary: Mapping[str, Any]) -> list[float | None]:
    """Ledger seconds at each evaluation: every phase up to and including its phase."""
    phases = sorted(summary.get("phases", []), key=lambda p: p["id"])
    out: list[float | None] = []
    for ev in summary.get("evaluations", []):
        limit, created = ev.get("phase_id"), ev.get("created_at")
        if limit is not None:
            chosen = [p for p in phases if p["id"] <= limit]
        elif created is not None:  # not bound to a phase: the phases finished before it
            chosen = [p for p in phases if p.get("ended_at") and p["ended_at"] <= created]
        else:
            out.append(None)
            continue
        out.append(sum(_finite(p.get("seconds")) or 0.0 for p in chosen))
    return out


# ---------------------------------------------------------------------------- series maths


def ema(values: Sequence[float | None], weight: float = SMOOTHING) -> list[float | None]:
    """The exponential moving average TensorBoard smooths scalars with, debiased.

    ``m_k = weight * m_(k-1) + (1 - weight) * v_k`` from ``m_0 = 0``, reported as
    ``m_k / (1 - weight**k)`` so early values are not pulled towards 0 (the first is
    ``v_1`` itself). Missing or non-finite values stay gaps and do not move the average.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"the smoothing weight must be in [0, 1), got {weight}")
    out: list[float | None] = []
    last, k = 0.0, 0
    for v in values:
        x = _finite(v)
        if x is None:
            out.append(None)
            continue
        k += 1
        last = weight * last + (1.0 - weight) * x
        out.append(last / (1.0 - weight**k))
    return out


def tokens_per_second(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, tokens/s) of the per-update rows that know their wall seconds: each
    update's tokens over its own seconds."""
    steps, rates = [], []
    for r in rows:
        seconds, tokens = _finite(r.get("seconds")), _finite(r.get("tokens"))
        if seconds is None or seconds <= 0 or tokens is None:
            continue
        steps.append(int(r["step"]))
        rates.append(tokens / seconds)
    return steps, rates


def _sig(v: float | None) -> float | None:
    """``v`` to 6 significant digits: what a hover shows, in half the page bytes."""
    return None if v is None else float(f"{v:.6g}")


def thin(n: int, cap: int = MAX_POINTS) -> list[int]:
    """Indices of at most ``cap`` points evenly spread over ``n``, first and last kept."""
    if n <= cap:
        return list(range(n))
    return sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})


# ---------------------------------------------------------------------------- legend labels


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested recipe as dotted keys: ``{"train": {"lr": 0.01}}`` -> ``{"train.lr": 0.01}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _value_text(value: Any) -> str:
    if value is _UNSET:
        text = "unset"
    elif value is None:
        text = "none"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= LABEL_VALUE_CHARS else text[: LABEL_VALUE_CHARS - 1] + "…"


def recipe_labels(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """A legend label per run: the recipe keys (dotted, from each summary's resolved
    ``run["recipe"]``) whose values differ between the runs, as ``key=value``.

    The ``log`` section (where a run logs) is not a difference; the recipe ``name`` is
    named only when nothing else differs. At most ``LABEL_KEYS`` keys are named, then
    ``+n more``. When nothing differs the label is the run's name, or its id when names
    repeat; runs whose labels would still coincide get that name or id appended."""
    flat = [
        {
            k: v
            for k, v in flatten(s["run"].get("recipe") or {}).items()
            if k.split(".")[0] not in IGNORED_SECTIONS
        }
        for s in summaries
    ]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    differ = [k for k in keys if len({_value_text(f.get(k, _UNSET)) for f in flat}) > 1]
    if differ != ["name"]:
        differ = [k for k in differ if k != "name"]
    names = [str(s["run"].get("name") or s["run"]["id"]) for s in summaries]
    fallback = names if len(set(names)) == len(names) else [str(s["run"]["id"]) for s in summaries]
    labels = []
    for f, own in zip(flat, fallback, strict=True):
        parts = [f"{k}={_value_text(f.get(k, _UNSET))}" for k in differ]
        if len(parts) > LABEL_KEYS:
            parts = [*parts[:LABEL_KEYS], f"+{len(parts) - LABEL_KEYS} more"]
        labels.append(", ".join(parts) or own)
    counts = Counter(labels)
    return [
        f"{label} ({own})" if counts[label] > 1 else label
        for label, own in zip(labels, fallback, strict=True)
    ]


# ---------------------------------------------------------------------------- validation


def _unit(summary: Mapping[str, Any]) -> str:
    run = summary["run"]
    contract = (run.get("meta") or {}).get("contract") or {}
    if contract.get("unit"):
        return str(contract["unit"])
    return BPB_UNIT if str(run["target_metric"]).startswith("bpb") else "nat/token"


def measure(metric: str) -> str:
    """A validation metric in words: ``bpb`` is bits per byte, ``loss/code`` the loss
    on code; a metric of another name is its name."""
    head, _, domain = metric.partition("/")
    words = {"bpb": "bits per byte", "loss": "loss"}.get(head, head)
    return f"{words} on {domain}" if domain else words


def unit_groups(summaries: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    """The runs (their indices) by the unit of their target, in order of first
    appearance: a y axis holds one unit, so loss and bits per byte are drawn apart."""
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault(_unit(s), []).append(i)
    return groups


def validation_title(summaries: Sequence[Mapping[str, Any]], runs: Sequence[int]) -> str:
    """What the validation charts of ``runs`` plot, with its unit: ``validation bits
    per byte (bit/byte)`` (raw text: escape it where it is placed)."""
    measures = dict.fromkeys(measure(str(summaries[i]["run"]["target_metric"])) for i in runs)
    units = dict.fromkeys(_unit(summaries[i]) for i in runs)
    return f"validation {', '.join(measures)} ({', '.join(units)})"


def _run_meta(summary: Mapping[str, Any], role: str) -> dict[str, str]:
    return {"run": t(summary["run"]["id"]), "role": role}


def _eval_trace(
    s: Mapping[str, Any], i: int, label: str, xs: Sequence[float | None], metric: str, unit: str
) -> dict[str, Any]:
    """One run's evaluations of ``metric`` against ``xs``; failed measurements are gaps."""
    evs = s.get("evaluations", [])
    ys = [_finite((ev.get("metrics") or {}).get(metric)) for ev in evs]
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
        "meta": {**_run_meta(s, "series"), "metric": t(metric), "unit": t(unit)},
        "hovertemplate": "%{meta.run}<br>step %{customdata[0]:,}, %{customdata[1]:,} tokens"
        "<br>%{meta.metric} %{y:.4f} %{meta.unit}",
    }


def _x_values(s: Mapping[str, Any], x: str) -> list[float | None]:
    if x == "seconds":
        return eval_seconds(s)
    return [_finite(ev.get(x)) for ev in s.get("evaluations", [])]


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
        xs = _x_values(s, x)
        trace = _eval_trace(s, i, label, xs, s["run"]["target_metric"], _unit(s))
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
                    "meta": _run_meta(s, "confirm"),
                }
            )
    thresholds = sorted({float(summaries[i]["run"]["target_value"]) for i in runs})
    # A legend entry names each line: a label on the line itself would sit outside the
    # plot (and under the buttons) when the line is at the edge of the y range.
    shapes = [
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": "y",
            "y0": v,
            "y1": v,
            "line": {"color": "#000", "width": 1.5, "dash": "dash"},
            "name": f"target {v:g}",
            "showlegend": True,
        }
        for v in thresholds
    ]
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
        _finite((ev.get("metrics") or {}).get("bpb")) is not None
        for s in summaries
        for ev in s.get("evaluations", [])
    )


def bpb_figure(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> Any:
    """Validation bits per byte against tokens: comparable across tokenizers."""
    data = [
        _eval_trace(s, i, label, _x_values(s, "tokens"), "bpb", BPB_UNIT)
        for i, (s, label) in enumerate(zip(summaries, labels, strict=True))
    ]
    return figure(data, layout(axis(TOKENS, rangemode="tozero"), axis(BPB), log_toggle=True))


# ---------------------------------------------------------------------------- per update

Series = Callable[[Sequence[Mapping[str, Any]]], tuple[list[int], list[float | None]]]


def _column(name: str) -> Series:
    def get(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float | None]]:
        return [int(r["step"]) for r in rows], [_finite(r.get(name)) for r in rows]

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
                    "y": [_sig(ys[k]) for k in keep],
                    "showlegend": False,
                    "opacity": 0.3,
                    "line": {"color": run_color(i), "width": 1, "dash": run_dash(i)},
                    "meta": _run_meta(s, "raw"),
                    "hovertemplate": hover + " (raw)",
                }
            )
            smoothed = ema(ys)
            data.append(
                {
                    **base,
                    "y": [_sig(smoothed[k]) for k in keep],
                    "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
                    "meta": _run_meta(s, "smoothed"),
                    "hovertemplate": hover + f" (moving average, weight {SMOOTHING:g})",
                }
            )
        else:
            data.append(
                {
                    **base,
                    "y": [_sig(ys[k]) for k in keep],
                    "line": {"color": run_color(i), "width": 2, "dash": run_dash(i)},
                    "meta": _run_meta(s, "value"),
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
                "x": [_finite(s.get("phase_totals", {}).get(kind)) or 0.0 for s in summaries],
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
        (t(s["run"]["id"]), sum(_finite(v) or 0.0 for v in s.get("phase_totals", {}).values()))
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


# ---------------------------------------------------------------------------- tables


def _num(v: Any, fmt: str = ",") -> str:
    return "-" if v is None else e(format(v, fmt))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _swatch(i: int) -> str:
    return f'<span class="swatch" style="background:{run_color(i)}"></span>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "compare") -> str:
    """A table in a box that scrolls sideways itself, so the page never does."""
    return (
        f'<div class="scroll"><table class="{cls}"><thead><tr>'
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</tbody></table></div>"
    )


def comparison_html(result: Mapping[str, Any]) -> str:
    verdicts = {c["run"]: c for c in result["comparisons"]}
    head = (
        "run", "seed", "time to target", "step", "tokens", "updates", "s/step",
        "prep", "tokenize", "eval", "checkpoint", "vs baseline", "why",
    )  # fmt: skip
    rows = []
    for i, f in enumerate(result["runs"]):
        c = verdicts.get(f["id"])
        if f["reached"]:
            ttt = f"{f['time_to_target']:,.1f} s"
        elif f.get("final_value") is not None:
            ttt = f"not reached (final {f['final_value']:.4f})"
        else:
            ttt = "not reached"
        why = "" if c is None else c["reason"]
        if c is not None and c["recipe_diff"]:
            why += "; recipe: " + "; ".join(c["recipe_diff"][:6])
            if len(c["recipe_diff"]) > 6:
                why += f"; ... {len(c['recipe_diff']) - 6} more"
        rows.append(
            [
                _swatch(i) + e(f["id"]),
                e(f["seed"]),
                e(ttt),
                _num(f["steps_to_target"]),
                _num(f["tokens_to_target"]),
                _num(f["updates_to_target"]),
                _num(f["train_step_seconds"], ".4f"),
                *(_pct(f["shares"].get(k)) for k in ("prep", "tokenize", "eval", "checkpoint")),
                "baseline" if c is None else e(c["class"]),
                e(why),
            ]
        )
    groups = []
    for g in result["seed_groups"]:
        if g["n"] < 2:
            continue
        s = g["time_to_target"]
        if s["n"] == 0:
            spread = "none reached the target"
        else:
            std = "-" if s["std"] is None else f"{s['std']:,.1f}"
            spread = (
                f"time to target mean {s['mean']:,.1f} s, min-max {s['min']:,.1f}-"
                f"{s['max']:,.1f} s, std {std} s (n={s['n']})"
            )
        seeds = ", ".join(str(x) for x in g["seeds"])
        groups.append(
            f"<li>{e(', '.join(g['runs']))} (seeds {e(seeds)}): reached "
            f"{g['n_reached']}/{g['n']}; {e(spread)}</li>"
        )
    out = _table(head, rows)
    if groups:
        out += "<h3>Seed groups</h3><ul>" + "".join(groups) + "</ul>"
    out += f'<p class="final">{e(result["final_figure"])}</p>'
    out += f'<p class="rule"><b>Rule.</b> {e(result["rule"])}</p>'
    return out


def mixture_html(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Per run and domain: the configured weight beside the tokens consumed, their share
    and the epochs over the domain's train tokens; and each domain's final validation
    loss. Empty when no run counted tokens per domain."""
    head = ("run", "domain", "weight", "consumed tokens", "share", "epochs", "final val loss")
    rows = []
    for i, s in enumerate(summaries):
        finals = final_domain_losses(s)
        for r in realised(s):
            rows.append(
                [
                    _swatch(i) + e(s["run"]["id"]),
                    e(r["domain"]),
                    _num(r["weight"], ".4f"),
                    _num(r["tokens"]),
                    _num(r["share"], ".4f"),
                    _num(r["exposure"], ".3g"),
                    _num(finals.get(r["domain"]), ".4f"),
                ]
            )
    if not rows:
        return ""
    return "<h2>Mixture: configured and consumed</h2>" + _table(head, rows)


# ---------------------------------------------------------------------------- the page


def _run_list(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    items = []
    for i, (s, label) in enumerate(zip(summaries, labels, strict=True)):
        r, ttt = s["run"], s["time_to_target"]
        verdict = (
            f"target reached at step {ttt['step']} after {ttt['seconds']:,.1f} s"
            if ttt["reached"]
            else "target NOT reached"
        )
        last = s["evaluations"][-1]["metrics"] if s["evaluations"] else {}
        if _finite(last.get("bpb")) is not None:  # comparable across tokenizers
            verdict += f"; final validation {last['bpb']:.4f} bits per byte"
        items.append(
            f"<li>{_swatch(i)}<b>{e(r['id'])}</b> [{e(label)}] (recipe {e(r.get('name'))}, "
            f"status {e(r.get('status'))}): val {e(r['target_metric'])} &lt;= "
            f"{e(format(r['target_value'], 'g'))} {e(_unit(s))}; {e(verdict)}</li>"
        )
    return f"<ul class='runs'>{''.join(items)}</ul>"


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
        mixture_html(summaries),
        "<h2>Comparison</h2>",
        comparison_html(result),
    ]
    title = f"ledgerlm report: {len(summaries)} run(s)"
    return page(title, f"<h1>{e(title)}</h1>{''.join(sections)}")
