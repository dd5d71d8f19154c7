"""Page and chart primitives shared by the HTML reports (``run_report.py``, ``scaling_report.py``).

Everything here writes inline SVG or HTML as strings: no scripts, no external resources.
Text that comes from data goes through :func:`e` (``html.escape``); tick labels and
numbers are produced here and escaped as well.

A :class:`Scale` maps data values to pixels, linearly or in log10 (``log=True``);
:func:`axes` draws the frame, grid, tick labels and axis titles of a ``W`` x ``H``
chart, and :func:`chart_svg` and :func:`page` wrap a chart and a whole document.
"""

from __future__ import annotations

import html
import math
from typing import Any

RUN_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)

W, H = 720, 340
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50


def e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def log_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    """Tick values for a log axis over [lo, hi] (both > 0): powers of ten, thinned to at
    most ``count``; 1-2-5 steps when fewer than two decades fall inside."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi <= lo:
        return [lo]
    k0 = math.ceil(math.log10(lo) - 1e-9)
    k1 = math.floor(math.log10(hi) + 1e-9)
    decades = [10.0**k for k in range(k0, k1 + 1)]
    if len(decades) >= 2:
        step = math.ceil(len(decades) / count)
        return decades[::step]
    ticks = [
        m * 10.0**k
        for k in range(k0 - 1, k1 + 1)
        for m in (1, 2, 5)
        if lo * (1 - 1e-9) <= m * 10.0**k <= hi * (1 + 1e-9)
    ]
    return ticks if len(ticks) >= 2 else nice_ticks(lo, hi)


def fmt_tick(v: float) -> str:
    """A short label for a tick on a linear axis: 0, 0.25, 12, 40k, 3M."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


def fmt_log_tick(v: float) -> str:
    """A short label for a tick on a log axis: 0.01, 500, 10M, 1B, 3e20."""
    a = abs(v)
    if v == 0 or 1e-3 <= a < 1e3:
        return f"{v:g}"
    if 1e3 <= a < 1e15:
        for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
            if a >= div:
                return f"{v / div:g}{suffix}"
    k = math.floor(math.log10(a))
    return f"{round(v / 10.0**k, 2):g}e{k}"


class Scale:
    """Data value -> pixel: [lo, hi] onto [a, b], linear or (``log=True``) in log10."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False) -> None:
        if log and not lo > 0:
            raise ValueError(f"a log scale needs lo > 0, got {lo}")
        if hi <= lo:
            lo, hi = (lo / 10**0.5, hi * 10**0.5) if log else (lo - 0.5, hi + 0.5)
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log
        self._u = (math.log10(lo), math.log10(hi)) if log else (lo, hi)

    def __call__(self, v: float) -> float:
        u = math.log10(v) if self.log else v
        u0, u1 = self._u
        return self.a + (u - u0) / (u1 - u0) * (self.b - self.a)

    def ticks(self) -> list[float]:
        return log_ticks(self.lo, self.hi) if self.log else nice_ticks(self.lo, self.hi)

    def label(self, v: float) -> str:
        return fmt_log_tick(v) if self.log else fmt_tick(v)


def axes(xs: Scale, ys: Scale, xlabel: str, ylabel: str) -> list[str]:
    """Frame, grid lines, tick labels and axis titles of a ``W`` x ``H`` chart."""
    out = [
        f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" '
        f'height="{H - TOP - BOTTOM}" fill="#fff" stroke="#999"/>'
    ]
    for t in xs.ticks():
        x = xs(t)
        out.append(
            f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{e(xs.label(t))}</text>'
        )
    for t in ys.ticks():
        y = ys(t)
        label = ys.label(t) if ys.log else f"{t:g}"
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{e(label)}</text>'
        )
    out.append(
        f'<text x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 12}" text-anchor="middle">'
        f"{e(xlabel)}</text>"
        f'<text transform="translate(16 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{e(ylabel)}</text>'
    )
    return out


def chart_svg(axis: str, body: list[str], label: str, height: int = H) -> str:
    """One chart: an inline ``<svg class="chart" data-axis=...>`` of width ``W``."""
    return (
        f'<svg class="chart" data-axis="{e(axis)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img" '
        f'aria-label="{e(label)}">' + "".join(body) + "</svg>"
    )


CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
svg.chart { display: block; max-width: 100%; height: auto; font-size: 11px; }
svg text { fill: #333; } .barlabel { font-weight: 600; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: right; vertical-align: top; }
td:first-child, th:first-child, td:last-child, th:last-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.tick { display: inline-block; width: 3px; height: 12px; background: #000; margin-right: 5px; }
.key { margin-right: 12px; white-space: nowrap; }
.rule, .final { max-width: 900px; } .rule { color: #555; font-size: 12px; }
"""


def page(title: str, body: str, css: str = "") -> str:
    """A whole self-contained document: ``title`` (escaped here) and ``body`` (HTML as
    given), styled by ``CSS`` plus ``css``."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{e(title)}</title><style>{CSS}{css}</style>"
        f"</head><body>{body}</body></html>\n"
    )
