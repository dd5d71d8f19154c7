"""A self-contained HTML report over runs: loss curves, phase times, the comparison.

The page is one file with inline SVG (drawn with the primitives in ``charts.py``, shared
with the scaling report), no scripts and no external resources, so it opens anywhere and
can be archived beside the ledger. Every piece of text that comes from the ledger (run
ids and names, metric names, phase kinds, recipe values) goes through ``html.escape``:
a run may be named ``<script>``.

The time axis is the ledger's own clock: at each evaluation, the summed wall time of
every phase recorded up to and including that evaluation's phase. That is the sum
time-to-target is made of, so each run's confirming evaluation sits exactly at its
time-to-target, and time a killed run spent waiting to be resumed is not drawn as work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import compare_runs, final_domain_losses
from ledgerlm.ledger.mixture import realised
from ledgerlm.report.charts import (
    BOTTOM,
    LEFT,
    RIGHT,
    RUN_COLORS,
    TOP,
    H,
    Scale,
    W,
    axes,
    chart_svg,
    e,
    fmt_tick,
    nice_ticks,
    page,
    run_color,
)

PHASE_ORDER = ("search", "prep", "tokenize", "restore", "train", "eval", "checkpoint")
PHASE_COLORS = {
    "prep": "#8dd3c7",
    "tokenize": "#80b1d3",
    "restore": "#bebada",
    "train": "#fdb462",
    "eval": "#fb8072",
    "checkpoint": "#b3de69",
}
OTHER_PHASE_COLORS = ("#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _dash(index: int) -> str:
    # Past the palette, runs share a colour; a dash pattern keeps them apart.
    return "" if index < len(RUN_COLORS) else ' stroke-dasharray="6 3"'


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


def _curves(summaries: Sequence[Mapping[str, Any]], axis: str) -> list[dict[str, Any]]:
    """Per run: (x, loss) points on one axis and the confirming evaluation's point."""
    curves = []
    for index, s in enumerate(summaries):
        metric = s["run"]["target_metric"]
        seconds = eval_seconds(s) if axis == "seconds" else None
        points: list[tuple[float, float] | None] = []
        confirm = None
        confirming = s["time_to_target"].get("evaluation") or {}
        for i, ev in enumerate(s.get("evaluations", [])):
            x = seconds[i] if seconds is not None else _finite(ev.get(axis))
            y = _finite((ev.get("metrics") or {}).get(metric))
            if x is None or y is None:
                points.append(None)  # a gap: a failed measurement is not drawn as a value
                continue
            points.append((x, y))
            if confirming and ev.get("id") == confirming.get("id"):
                confirm = (x, y, ev)
        curves.append({"index": index, "summary": s, "points": points, "confirm": confirm})
    return curves


def line_chart(summaries: Sequence[Mapping[str, Any]], axis: str, xlabel: str) -> str:
    """Validation loss against ``axis`` (seconds, tokens or updates), one series per run."""
    curves = _curves(summaries, axis)
    pts = [p for c in curves for p in c["points"] if p is not None]
    thresholds = sorted({float(s["run"]["target_value"]) for s in summaries})
    metrics = sorted({str(s["run"]["target_metric"]) for s in summaries})
    xs_all = [p[0] for p in pts] or [0.0, 1.0]
    ys_all = [p[1] for p in pts] + thresholds
    y_lo, y_hi = min(ys_all), max(ys_all)
    pad = (y_hi - y_lo) * 0.06 or 0.5
    # A little room on the right so the last ring is not cut by the frame.
    xs = Scale(min(0.0, *xs_all), max(xs_all) * 1.03, LEFT, W - RIGHT)
    ys = Scale(y_lo - pad, y_hi + pad, H - BOTTOM, TOP)
    body = axes(xs, ys, xlabel, f"validation {', '.join(metrics)}")
    for t in thresholds:
        y = ys(t)
        body.append(
            f'<g class="target"><line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" '
            f'stroke="#000" stroke-width="1.5" stroke-dasharray="8 4"/>'
            f'<text x="{LEFT + 6}" y="{y - 5:.1f}">target '
            f"{e(f'{t:g}')}</text><title>target {e(f'{t:g}')}</title></g>"
        )
    for c in curves:
        s, i = c["summary"], c["index"]
        color, run_id = run_color(i), s["run"]["id"]
        segments: list[list[tuple[float, float]]] = [[]]
        for p in c["points"]:
            if p is None:
                segments.append([])
            else:
                segments[-1].append(p)
        parts = [f'<g class="series" data-run="{e(run_id)}"><title>{e(run_id)}</title>']
        for seg in segments:
            if len(seg) > 1:
                coords = " ".join(f"{xs(x):.1f},{ys(y):.1f}" for x, y in seg)
                parts.append(
                    f'<polyline points="{coords}" fill="none" stroke="{color}" '
                    f'stroke-width="2"{_dash(i)}/>'
                )
            for x, y in seg:
                parts.append(f'<circle cx="{xs(x):.1f}" cy="{ys(y):.1f}" r="2.5" fill="{color}"/>')
        parts.append("</g>")
        body.append("".join(parts))
        if c["confirm"] is not None:
            x, y, ev = c["confirm"]
            ttt = s["time_to_target"]["seconds"]
            label = (
                f"{run_id}: target confirmed at step {ev.get('step')}, "
                f"{ev.get('tokens')} tokens, {ttt:.1f} s"
            )
            body.append(
                f'<g class="confirm" data-run="{e(run_id)}"><circle cx="{xs(x):.1f}" '
                f'cy="{ys(y):.1f}" r="7" fill="none" stroke="{color}" stroke-width="2.5"/>'
                f'<line x1="{xs(x):.1f}" y1="{ys(y) + 7:.1f}" x2="{xs(x):.1f}" '
                f'y2="{H - BOTTOM}" stroke="{color}" stroke-dasharray="2 2"/>'
                f"<title>{e(label)}</title></g>"
            )
    return chart_svg(axis, body, f"validation loss against {xlabel}")


def _phase_kinds(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    seen = dict.fromkeys(k for s in summaries for k in s.get("phase_totals", {}))
    return [k for k in PHASE_ORDER if k in seen] + [k for k in seen if k not in PHASE_ORDER]


def _phase_color(kind: str, kinds: Sequence[str]) -> str:
    if kind in PHASE_COLORS:
        return PHASE_COLORS[kind]
    others = [k for k in kinds if k not in PHASE_COLORS]
    return OTHER_PHASE_COLORS[others.index(kind) % len(OTHER_PHASE_COLORS)]


def phase_bars(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Stacked horizontal bar of phase seconds per run; a tick marks time-to-target."""
    kinds = _phase_kinds(summaries)
    row_h, bar_h = 46, 20
    height = TOP + row_h * len(summaries) + BOTTOM
    longest = max((float(s.get("total_seconds") or 0.0) for s in summaries), default=0.0)
    xs = Scale(0.0, longest or 1.0, LEFT, W - RIGHT)
    body = []
    for t in nice_ticks(xs.lo, xs.hi):
        x = xs(t)
        body.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{height - BOTTOM}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">'
            f"{e(fmt_tick(t))}</text>"
        )
    body.append(
        f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{height - 12}" text-anchor="middle">'
        "wall time (s) per phase kind, whole run</text>"
    )
    for i, s in enumerate(summaries):
        run_id = s["run"]["id"]
        y = TOP + i * row_h + 16
        body.append(
            f'<text x="{LEFT}" y="{y - 4}" class="barlabel">{e(run_id)}</text>'
            f'<g class="bar" data-run="{e(run_id)}">'
        )
        x0 = 0.0
        for kind in kinds:
            sec = _finite(s.get("phase_totals", {}).get(kind)) or 0.0
            if sec <= 0:
                continue
            body.append(
                f'<rect class="phase" data-phase="{e(kind)}" x="{xs(x0):.1f}" y="{y}" '
                f'width="{max(xs(x0 + sec) - xs(x0), 0.5):.1f}" height="{bar_h}" '
                f'fill="{_phase_color(kind, kinds)}" stroke="#fff" stroke-width="0.5">'
                f"<title>{e(run_id)}: {e(kind)} {sec:,.1f} s</title></rect>"
            )
            x0 += sec
        body.append("</g>")
        ttt = s["time_to_target"]
        if ttt["reached"] and ttt["seconds"] is not None:
            x = xs(ttt["seconds"])
            body.append(
                f'<g class="ttt" data-run="{e(run_id)}"><line x1="{x:.1f}" y1="{y - 3}" '
                f'x2="{x:.1f}" y2="{y + bar_h + 3}" stroke="#000" stroke-width="2.5"/>'
                f"<title>{e(run_id)}: time to target {ttt['seconds']:,.1f} s</title></g>"
            )
        else:
            body.append(
                f'<text x="{xs(x0) + 6:.1f}" y="{y + 15}" fill="#b00">target not reached</text>'
            )
    legend = " ".join(
        f'<span class="key"><span class="swatch" style="background:{_phase_color(k, kinds)}">'
        f"</span>{e(k)}</span>"
        for k in kinds
    )
    svg = chart_svg("phases", body, "phase times per run", height)
    return (
        f'{svg}<p class="legend">{legend} <span class="key">'
        f'<span class="tick"></span>time to target</span></p>'
    )


def _num(v: Any, fmt: str = ",") -> str:
    return "-" if v is None else e(format(v, fmt))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


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
        cells = [
            f'<span class="swatch" style="background:{run_color(i)}"></span>{e(f["id"])}',
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
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
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
    out = (
        '<table class="compare"><thead><tr>'
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
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
            cells = [
                f'<span class="swatch" style="background:{run_color(i)}"></span>'
                f"{e(s['run']['id'])}",
                e(r["domain"]),
                _num(r["weight"], ".4f"),
                _num(r["tokens"]),
                _num(r["share"], ".4f"),
                _num(r["exposure"], ".3g"),
                _num(finals.get(r["domain"]), ".4f"),
            ]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    return (
        "<h2>Mixture: configured and consumed</h2>"
        '<table class="compare"><thead><tr>'
        + "".join(f"<th>{e(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def render_report(summaries: list[dict]) -> str:
    """The whole report page for ``summaries`` (``Ledger.run_summary`` dicts), as HTML."""
    if not summaries:
        raise ValueError("a report needs at least one run")
    result = compare_runs(summaries)
    runs = []
    for i, s in enumerate(summaries):
        r, ttt = s["run"], s["time_to_target"]
        verdict = (
            f"target reached at step {ttt['step']} after {ttt['seconds']:,.1f} s"
            if ttt["reached"]
            else "target NOT reached"
        )
        threshold = f"{r['target_value']:g}"
        last = s["evaluations"][-1]["metrics"] if s["evaluations"] else {}
        if last.get("bpb") is not None:  # comparable across tokenizers
            verdict += f"; final validation {last['bpb']:.4f} bits per byte"
        runs.append(
            f'<li><span class="swatch" style="background:{run_color(i)}"></span>'
            f"<b>{e(r['id'])}</b> (recipe {e(r.get('name'))}, status {e(r.get('status'))}): "
            f"val {e(r['target_metric'])} &lt;= {e(threshold)}; "
            f"{e(verdict)}</li>"
        )
    charts = [
        ("seconds", "wall time (s): all phases up to the evaluation"),
        ("tokens", "tokens seen"),
        ("updates", "optimizer updates"),
    ]
    sections = "".join(
        f"<h2>Validation loss against {e(label.split(':')[0])}</h2>"
        f"{line_chart(summaries, axis, label)}"
        for axis, label in charts
    )
    title = f"ledgerlm report: {len(summaries)} run(s)"
    body = (
        f"<h1>{e(title)}</h1>"
        "<p>Each evaluation is a point; the dashed black line is the target; a ring marks "
        "the evaluation that first confirmed it (time-to-target ends there). The first run "
        "is the baseline of the comparison.</p>"
        f"<ul class='runs'>{''.join(runs)}</ul>"
        f"{sections}"
        "<h2>Time per phase</h2>"
        f"{phase_bars(summaries)}"
        f"{mixture_html(summaries)}"
        "<h2>Comparison</h2>"
        f"{comparison_html(result)}"
    )
    return page(title, body)
