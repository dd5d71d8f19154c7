"""Shared by the HTML report tests: reading plotly figures back from a page, and a
headless Chromium that draws them."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

FIGURE = re.compile(
    r'<script type="application/json" class="figure-spec" data-figure="([a-z0-9-]+)">'
    r"(.*?)</script>",
    flags=re.S,
)
# Axis titles that are a count: the count is the unit.
COUNTS = {"tokens", "optimizer updates", "learning rate", "run", "parameters N"}


def figure_blocks(page: str) -> dict[str, str]:
    """Each figure's JSON block as written in the page, by figure name, in page order."""
    blocks = dict(FIGURE.findall(page))
    assert len(blocks) == len(FIGURE.findall(page)), "two figures share a name"
    return blocks


def figures(page: str) -> dict[str, dict[str, Any]]:
    """Each figure's spec (data, layout, config), by name, in page order; each has the
    ``<div>`` plotly draws it into."""
    out = {name: json.loads(text) for name, text in figure_blocks(page).items()}
    for name in out:
        assert f'<div class="figure" id="figure-{name}" data-figure="{name}"></div>' in page
    return out


def traces(spec: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [tr for tr in spec["data"] if (tr.get("meta") or {}).get("role") == role]


def axis_titles(spec: dict[str, Any]) -> dict[str, str]:
    """``{"xaxis": title, "yaxis": title, ...}`` of a figure."""
    lay = spec["layout"]
    return {
        key: ((lay[key].get("title") or {}).get("text") or "")
        for key in sorted(lay)
        if re.fullmatch(r"[xy]axis\d*", key)
    }


def has_unit(title: str) -> bool:
    """A quantity with its unit in parentheses, or a count."""
    return bool(re.search(r"\([^()]+\)", title)) or title in COUNTS


def plotlyjs() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def without_plotlyjs(page: str) -> str:
    """The page with the inlined plotly.js taken out (its tag stays): what the report
    itself wrote."""
    js = plotlyjs()
    assert page.count(js) == 1, "plotly.js is not inlined exactly once"
    return page.replace(js, "")


def headless_chromium():
    """A headless Chromium driven by chromedriver, or a skip that says what is missing.

    The browser log ("goog:loggingPrefs") is on, so a test can read the console, and
    ``window.alert`` is replaced before any page script runs, so a test can see
    (``alerts``) whether a page tried to raise one."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    chromium = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(
            "chromium or chromedriver not found: run `make browser` "
            "(Debian: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {"source": "window.__alerts = []; window.alert = m => window.__alerts.push(String(m));"},
    )
    return driver


def drawn_cleanly(page: str, names: Mapping[str, Any], folder: Path, width: int) -> list[dict]:
    """``page`` written to ``folder`` and drawn in a headless Chromium window ``width``
    px wide: every figure ``names`` holds (a page's ``figures``) drawn, in its order,
    and nothing overlapping another or leaving its figure (``layout_faults``). The
    figures as drawn, for what a test checks besides."""
    path = folder / "report.html"
    path.write_text(page, encoding="utf-8")
    driver = headless_chromium()
    try:
        driver.set_window_size(width, 1000)
        driver.get(path.as_uri())
        drawn = drawn_figures(driver, len(names))
        assert [d["name"] for d in drawn] == list(names)
        faults = layout_faults(driver)
        assert faults == [], "; ".join(faults)
        return drawn
    finally:
        driver.quit()


def console_errors(driver) -> list[dict]:
    """Errors on the browser console since the last read (reading clears the log)."""
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def alerts(driver) -> list[str]:
    return driver.execute_script("return window.__alerts")


# Per plotly graph on the page: its figure name, box, how many traces it has and how
# many plotly drew (a non-empty group in the plot's SVG), the legend and axis titles as
# shown, and per scatter trace (in data order) its role and drawn markers.
_DRAWN = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const r = gd.getBoundingClientRect();
  const visible = el => {
    const b = el.getBoundingClientRect(); return b.width > 0 || b.height > 0; };
  const groups = Array.from(gd.querySelectorAll('.cartesianlayer g.trace'));
  const scatter = Array.from(gd.querySelectorAll('.scatterlayer g.trace'));
  const text = sel => Array.from(gd.querySelectorAll(sel)).map(el => el.textContent);
  return {
    name: gd.dataset.figure, w: r.width, h: r.height,
    svgs: gd.querySelectorAll('.main-svg').length,
    traces: gd.data.length, drawn: groups.filter(visible).length,
    lines: gd.querySelectorAll('.scatterlayer path.js-line').length,
    scatter: gd._fullData.filter(t => t.type === 'scatter').map((t, k) => ({
      role: t.meta ? t.meta.role : null,
      points: scatter[k] ? scatter[k].querySelectorAll('path.point').length : -1})),
    legend: text('.legendtext'), xtitle: text('.g-xtitle'), ytitle: text('.g-ytitle'),
    buttons: text('.updatemenu-button'),
  };
});
"""


def wait_for(condition, timeout: float = 5.0) -> bool:
    """Whether ``condition()`` came true within ``timeout`` seconds (polled)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def drawn_figures(driver, expected: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    """What plotly drew (see ``_DRAWN``), once ``expected`` graphs have their SVG."""
    deadline = time.monotonic() + timeout
    script = (
        "return Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".filter(gd => gd._fullLayout && gd.querySelector('.main-svg')).length"
    )
    while driver.execute_script(script) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return driver.execute_script(_DRAWN)


# Per plotly graph on the page: the boxes (viewport pixels) of its figure, its plot area
# and its legend, and of each piece of text or control drawn around the plot: legend
# entries, the linear/log buttons, plotly's toolbar (the modebar, drawn whether or not
# the mouse is over it), axis titles, tick labels, annotations and shape labels.
_PIECES = """
const pieces = [
  ['legend entry', '.legend .traces'], ['button', '.updatemenu-button'],
  ['modebar', '.modebar'], ['x title', '.g-xtitle text'], ['y title', '.g-ytitle text'],
  ['x tick', '.xtick text'], ['y tick', '.ytick text'], ['annotation', '.annotation'],
  ['shape label', '.shapelayer text'],
];
const box = el => {
  const b = el.getBoundingClientRect();
  return {l: b.left, t: b.top, r: b.right, b: b.bottom};
};
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const items = [];
  for (const [kind, selector] of pieces) {
    gd.querySelectorAll(selector).forEach(el => {
      const b = box(el);
      if (b.r > b.l && b.b > b.t) items.push({kind, text: el.textContent, ...b});
    });
  }
  const legend = gd.querySelector('.legend rect.bg');
  return {name: gd.dataset.figure, figure: box(gd),
          plot: box(gd.querySelector('.draglayer .nsewdrag')),
          legend: legend ? box(legend) : null, items};
});
"""
# Pieces that must sit inside the plot area (the others sit around it, never on it).
ON_PLOT = {"annotation", "shape label"}
AROUND = {"legend entry", "button", "modebar"}


def _inside(a: dict, b: dict, tol: float = 0.5) -> bool:
    return all(
        (a[k] >= b[k] - tol) if k in "lt" else (a[k] <= b[k] + tol) for k in ("l", "t", "r", "b")
    )


def _overlap(a: dict, b: dict, tol: float = 0.5) -> bool:
    return (
        min(a["r"], b["r"]) - max(a["l"], b["l"]) > tol
        and min(a["b"], b["b"]) - max(a["t"], b["t"]) > tol
    )


def layout_faults(driver) -> list[str]:
    """Each way the drawn figures fail to read cleanly, as a sentence; none is clean.

    A piece (see ``_PIECES``) is cut when it leaves its figure's box, a legend entry when
    it leaves the legend's box too (a scrolling legend hides it), an annotation or a
    shape label when it leaves the plot area; legend entries, buttons and the toolbar
    must not cover the plot area; and no two pieces may overlap."""
    faults = []
    for fig in driver.execute_script(_PIECES):
        name, items = fig["name"], fig["items"]
        for it in items:
            what = f"{name}: {it['kind']} {it['text']!r}"
            if not _inside(it, fig["figure"]):
                faults.append(f"{what} is cut by its figure")
            if it["kind"] == "legend entry" and not _inside(it, fig["legend"]):
                faults.append(f"{what} is cut by the legend")
            if it["kind"] in ON_PLOT and not _inside(it, fig["plot"]):
                faults.append(f"{what} is outside the plot area")
            if it["kind"] in AROUND and _overlap(it, fig["plot"]):
                faults.append(f"{what} covers the plot area")
        for i, a in enumerate(items):
            for b in items[i + 1 :]:
                if _overlap(a, b):
                    faults.append(
                        f"{name}: {a['kind']} {a['text']!r} overlaps {b['kind']} {b['text']!r}"
                    )
    return faults
