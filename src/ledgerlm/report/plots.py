"""Plotly figures on self-contained pages: what both HTML reports draw with.

A page (:func:`page`) inlines plotly.js once, in its head. Each figure travels as a JSON
data block (``<script type="application/json">``, which no browser runs) beside its
``<div>`` (:func:`figure_html`), and one short script at the end of the page hands every
block to ``Plotly.newPlot``. The file therefore opens offline, fetches nothing (no CDN,
no font, no image), and a test reads a figure's traces and axes back from the HTML
without a browser. Figures are responsive (``responsive: True``, autosized width, no
fixed pixel width), hover shows values and dragging zooms (double-click resets).

Text from the ledger reaches a page in two forms, both escaped:

- HTML text and attributes go through :func:`e` (``html.escape``);
- plotly text (trace names, hover text, tick labels, axis titles, shape labels) goes
  through :func:`t`: plotly draws it as SVG text but reads a subset of HTML tags in it
  (``<b>``, ``<a href>``, ``<br>``...) and decodes entities, so ``<``, ``>`` and ``&`` are
  escaped there and a run named ``<b>`` is shown as those three characters. Ledger text
  is never placed inside a hover *template* (where ``%{...}`` is read): templates are
  literal and take ledger text from a trace's ``meta`` or ``customdata``.

The JSON blocks escape ``<``, ``>`` and ``&`` as ``\\u003c``..., so no string can close
its ``<script>`` element. plotly itself is imported inside the functions that use it:
importing this module costs nothing, so the command line starts fast.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
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
HEIGHT = 380  # pixels; the width follows the page
CONFIG = {
    "responsive": True,
    "displaylogo": False,
    "modeBarButtonsToRemove": ["select2d", "lasso2d"],
}
# The legend runs along the figure's bottom edge, under the x axis title, and the bottom
# margin grows to hold it: at any width, its entries wrap into rows and none is cut.
LEGEND = {
    "orientation": "h",
    "xref": "container",
    "x": 0,
    "xanchor": "left",
    "yref": "container",
    "y": 0,
    "yanchor": "bottom",
    "maxheight": 10_000,  # pixels: never a scrolling legend, whose hidden entries are lost
    "itemsizing": "constant",  # every symbol one size: a big marker would overlap a row
}
# The top margin: plotly's toolbar (the modebar) on a first row, at the right; with a
# linear/log switch, the switch on a second row below it, so neither covers the other.
TOP = 40
TOP_WITH_SWITCH = 80
# Ticks asked of a log axis: with more, plotly labels every digit within a decade, and
# those labels overlap the decade's own ("9" on "1e-3") on a plot of a few decades.
LOG_TICKS = 3
WRAP = 36  # characters per line of a legend entry or a category label (fits 400 px)
# What a legend takes at a 400 px window, where its rows are narrowest: the figure grows
# by that much (see :func:`figure`). Generous estimates of plotly's own sizes at 12 px.
NARROW = 350  # px: a figure's width in a 400 px window (the page's padding and scroll bar)
CHAR = 7.0  # px: a character of legend text
LINE = 16  # px: a line of legend text
LEGEND_SYMBOL = 46  # px: an entry's symbol and the gap after it
LEGEND_PAD = 6  # px: above and below a row
_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")

# Hands each figure's JSON block to plotly; figures whose block fails to draw say so on
# the console (where the browser test looks) and leave the rest of the page standing.
_DRAW = """
document.querySelectorAll("script.figure-spec").forEach(function (block) {
  var name = block.dataset.figure;
  function failed(err) { console.error("figure " + name + " not drawn: " + err); }
  try {
    var spec = JSON.parse(block.textContent);
    var div = document.getElementById("figure-" + name);
    Plotly.newPlot(div, spec.data, spec.layout, spec.config).catch(failed);
  } catch (err) {
    failed(err);
  }
});
"""

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; padding: 0 16px;
  color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; } h3 { font-size: 15px; }
.figure { width: 100%; min-height: 200px; }
.scroll { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: right; vertical-align: top; }
td:first-child, th:first-child, td:last-child, th:last-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.rule, .final, .note { max-width: 900px; } .rule, .note { color: #555; font-size: 12px; }
.runs li { overflow-wrap: anywhere; }
"""


def e(value: Any) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def t(value: Any) -> str:
    """Escape anything for plotly text (names, hover text, labels): ``<``, ``>``, ``&``
    become entities, which plotly decodes and shows verbatim."""
    return html.escape(str(value), quote=False)


def lines(value: Any, width: int = WRAP) -> str:
    """Plotly text for ``value`` (escaped as by :func:`t`) in lines of at most ``width``
    characters, broken at spaces, after hyphens, else inside a word: plotly never wraps
    a legend entry or a tick label, so a long one would run off a narrow figure."""
    return "<br>".join(t(part) for part in textwrap.wrap(str(value), width) or [""])


def run_color(index: int) -> str:
    return RUN_COLORS[index % len(RUN_COLORS)]


def run_dash(index: int) -> str:
    # Past the palette, runs share a colour; a dash pattern keeps them apart.
    return "solid" if index < len(RUN_COLORS) else "dash"


def axis(title: str, *, log: bool = False, **extra: Any) -> dict[str, Any]:
    """A plotly axis: its title (a quantity and its unit, literal text) and type."""
    return {
        "title": {"text": title},
        "type": "log" if log else "linear",
        "automargin": True,
        "showline": True,
        "linecolor": "#999",
        "mirror": True,
        **extra,
    }


def log_y_buttons() -> list[dict[str, Any]]:
    """``updatemenus`` with a linear / log switch of the y axis (a log axis with
    ``LOG_TICKS`` ticks), just above the plot's left corner: the second row of the top
    margin (``TOP_WITH_SWITCH``), under the row of plotly's own toolbar."""
    return [
        {
            "type": "buttons",
            "direction": "right",
            "showactive": True,
            "active": 0,
            "x": 0.0,
            "xanchor": "left",
            "y": 1.02,
            "yanchor": "bottom",
            "pad": {"r": 0, "t": 0, "b": 0, "l": 0},
            "font": {"size": 11},
            "buttons": [
                {
                    "label": "linear y",
                    "method": "relayout",
                    "args": [{"yaxis.type": "linear", "yaxis.nticks": 0}],  # 0: plotly's own
                },
                {
                    "label": "log y",
                    "method": "relayout",
                    "args": [{"yaxis.type": "log", "yaxis.nticks": LOG_TICKS}],
                },
            ],
        }
    ]


def layout(
    xaxis: dict[str, Any],
    yaxis: dict[str, Any],
    *,
    log_toggle: bool = False,
    height: int = HEIGHT,
    **extra: Any,
) -> dict[str, Any]:
    """A figure's layout: autosized width, the legend along the bottom edge, full trace
    names in hover labels, and (``log_toggle``) the linear/log switch of the y axis.
    Axis titles, tick labels and the legend push the margins out (automargin)."""
    top = TOP_WITH_SWITCH if log_toggle else TOP
    out: dict[str, Any] = {
        "template": "plotly_white",
        "autosize": True,
        "height": height,
        "margin": {"l": 10, "r": 10, "t": top, "b": 10},
        "xaxis": xaxis,
        "yaxis": yaxis,
        "hovermode": "closest",
        "hoverlabel": {"namelength": -1},
        "legend": LEGEND,
        "font": {"family": "system-ui, sans-serif", "size": 12},
    }
    if log_toggle:
        out["updatemenus"] = log_y_buttons()
    out.update(extra)
    return out


def legend_names(data: list[dict[str, Any]], figure_layout: dict[str, Any]) -> list[str]:
    """The legend's entries: each trace and shape shown in it, by name."""
    traces = [tr.get("name") or "" for tr in data if tr.get("showlegend", True)]
    shapes = [
        sh.get("name") or "" for sh in figure_layout.get("shapes", ()) if sh.get("showlegend")
    ]
    return traces + shapes


def legend_height(names: list[str], row: float) -> int:
    """About how tall (px) plotly draws a horizontal legend of ``names`` (plotly text,
    lines split by ``<br>``) in rows ``row`` px wide. As plotly lays it out: an entry is
    its symbol and its longest line; entries that do not all fit on one row each take
    the widest one's width, as many a row as fit; a row is as tall as its tallest."""
    if not names:
        return 0
    texts = [name.split("<br>") for name in names]
    widths = [LEGEND_SYMBOL + CHAR * max(len(html.unescape(x)) for x in text) for text in texts]
    heights = [LEGEND_PAD + LINE * len(text) for text in texts]
    if sum(widths) <= row:
        return max(heights)
    per_row = max(1, int(row // max(widths)))
    return sum(max(heights[k : k + per_row]) for k in range(0, len(heights), per_row))


def _narrow_row(figure_layout: dict[str, Any]) -> float:
    """The width of a legend row in a ``NARROW`` figure: plotly lays the legend out in
    the plot's width, the figure's less the y axis title and tick labels."""
    ticks = (figure_layout.get("yaxis") or {}).get("ticktext") or ()
    chars = max((len(html.unescape(p)) for k in ticks for p in str(k).split("<br>")), default=4)
    return NARROW - 30 - CHAR * chars


def figure(data: list[dict[str, Any]], figure_layout: dict[str, Any]) -> Any:
    """A ``plotly.graph_objects.Figure``: building it checks every attribute name.

    The layout's ``height`` is the plot's and its axes'; the figure is as much taller as
    its legend is at a ``NARROW`` width, so a legend of many or long entries (wrapped on
    several rows there) never squeezes the plot. The legend is shown when it has two or
    more entries."""
    import plotly.graph_objects as go

    names = legend_names(data, figure_layout)
    shown = len(names) > 1
    height = figure_layout.get("height", HEIGHT)
    if shown:
        height += legend_height(names, _narrow_row(figure_layout))
    return go.Figure(data=data, layout={**figure_layout, "height": height, "showlegend": shown})


def _json(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def figure_spec(name: str, fig: Any) -> dict[str, Any]:
    """What the page holds for ``fig``: its data, layout and the plotly config."""
    import plotly.io as pio

    spec = json.loads(pio.to_json(fig, validate=False))  # NaN and numpy made plain JSON
    spec["config"] = {**CONFIG, "toImageButtonOptions": {"format": "svg", "filename": name}}
    return spec


def figure_html(name: str, fig: Any) -> str:
    """The ``<div>`` plotly draws ``fig`` into and the JSON block it draws from.

    ``name`` (lower-case letters, digits, dashes) names both: the div is
    ``#figure-<name>``, the block ``script.figure-spec[data-figure=<name>]``."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"a figure name is lower-case letters, digits and dashes: {name!r}")
    return (
        f'<div class="figure" id="figure-{name}" data-figure="{name}"></div>'
        f'<script type="application/json" class="figure-spec" data-figure="{name}">'
        f"{_json(figure_spec(name, fig))}</script>"
    )


def page(title: str, body: str, css: str = "") -> str:
    """A whole self-contained document: ``title`` (escaped here), ``body`` (HTML as
    given, with its :func:`figure_html` figures), styled by ``CSS`` plus ``css``, with
    plotly.js inlined once in the head and the script that draws the figures."""
    from plotly.offline import get_plotlyjs

    plotlyjs = get_plotlyjs()
    if "</script" in plotlyjs.lower():  # would end the inline script early
        raise RuntimeError("this plotly.js cannot be inlined: it contains '</script'")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{e(title)}</title><style>{CSS}{css}</style>"
        f'<script type="text/javascript">{plotlyjs}</script>'
        f'</head><body>{body}<script type="text/javascript">{_DRAW}</script></body></html>\n'
    )
