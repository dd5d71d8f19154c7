"""What the report's figures say and how they sit, on two real runs of configs/tiny.toml:
one whose target is in bits per byte (missed), one in nat/token (reached).

Each validation chart's heading and y axis name what it plots, with the unit; runs
whose targets have different units get charts of their own; no two figures repeat each
other. In headless Chromium at 400 and 1,400 px nothing around a plot (legend entries,
the linear/log buttons, plotly's toolbar, axis titles, tick labels, notes) overlaps
anything else or is cut by its figure, and the learning rate's log-y switch works."""

from __future__ import annotations

import html
import json
import re

import pytest

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger import Ledger
from ledgerlm.report.run.page import render_report
from ledgerlm.workspace import Workspace
from report_helpers import (
    axis_titles,
    console_errors,
    drawn_figures,
    figures,
    headless_chromium,
    layout_faults,
    wait_for,
)

SHORT = ["train.max_steps=20", "eval.every_steps=10"]
BPB_TARGET = "eval.target_bpb=1.0"  # far below what 20 updates reach: missed
LOSS_TARGET = "eval.target_loss=5.6"  # reached at the first evaluation
PER_UPDATE = ["train-loss", "lr", "grad-norm", "throughput"]
AGAINST = ["wall time (all phases up to the evaluation)", "tokens seen", "optimizer updates"]


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, str]:
    """The report of the bpb run, of the loss run, and of both (bpb first)."""
    ws = Workspace(tmp_path_factory.mktemp("figures"))
    ids = [run_recipe(load_recipe(TINY, [*SHORT, t]), ws).run_id for t in (BPB_TARGET, LOSS_TARGET)]
    with Ledger(ws.ledger_path) as led:
        summaries = [led.run_summary(r) for r in ids]
        steps = {r: led.steps(r) for r in ids}
    assert [s["run"]["target_metric"] for s in summaries] == ["bpb", "loss"]
    assert [s["time_to_target"]["reached"] for s in summaries] == [False, True]
    return {
        "bpb": render_report(summaries[:1], steps),
        "loss": render_report(summaries[1:], steps),
        "both": render_report(summaries, steps),
    }


def headings(page: str) -> dict[str, str | None]:
    """Each figure's heading: the ``<h2>`` just before its ``<div>``, as text."""
    found = re.findall(r'(?:<h2>([^<]*)</h2>)?<div class="figure" id="figure-([a-z0-9-]+)"', page)
    return {name: html.unescape(h) if h else None for h, name in found}


def validation(measure: str) -> list[str]:
    return [f"Validation {measure} against {x}" for x in AGAINST]


def test_titles_say_what_is_plotted(pages) -> None:
    bpb, loss, both = (headings(pages[k]) for k in ("bpb", "loss", "both"))
    # bits per byte: what the charts plot, and no chart of bits per byte again after them
    assert list(bpb) == ["val-seconds", "val-tokens", "val-updates", *PER_UPDATE, "phases"]
    assert list(bpb.values())[:3] == validation("bits per byte (bit/byte)")
    # the loss: its charts, then the bits per byte, which they do not show
    assert list(loss) == ["val-seconds", "val-tokens", "val-updates", "bpb-tokens",
                          *PER_UPDATE, "phases"]  # fmt: skip
    assert list(loss.values())[:4] == [
        *validation("loss (nat/token)"),
        "Validation bits per byte (bit/byte) against tokens seen",
    ]
    # both: one y axis holds one unit, so each unit has its charts
    assert list(both.values())[:7] == [
        *validation("bits per byte (bit/byte)"),
        *validation("loss (nat/token)"),
        "Validation bits per byte (bit/byte) against tokens seen",
    ]
    assert list(both)[3:6] == ["val-seconds-nat-token", "val-tokens-nat-token",
                               "val-updates-nat-token"]  # fmt: skip
    for page, units in ((pages["bpb"], ["bit/byte"]), (pages["both"], ["bit/byte", "nat/token"])):
        specs = figures(page)
        for name in [n for n in specs if n.startswith("val-")]:
            unit = units[1] if name.endswith("nat-token") else units[0]
            measure = "bits per byte" if unit == "bit/byte" else "loss"
            assert axis_titles(specs[name])["yaxis"] == f"validation {measure} ({unit})", name
            series = [tr for tr in specs[name]["data"] if tr["meta"]["role"] == "series"]
            assert [tr["meta"]["unit"] for tr in series] == [unit]


def test_no_figure_repeats_another(pages) -> None:
    for key, page in pages.items():
        specs, titles = figures(page), headings(page)
        shown = {}
        for name, spec in specs.items():
            data = json.dumps([[tr.get("x"), tr.get("y")] for tr in spec["data"]])
            shown.setdefault(data, []).append(name)
        assert [names for names in shown.values() if len(names) > 1] == [], key
        named = [(titles[n], *axis_titles(s).values()) for n, s in specs.items()]
        assert len(set(named)) == len(named), (key, named)


@pytest.fixture(scope="module")
def browser():
    driver = headless_chromium()
    yield driver
    driver.quit()


@pytest.mark.parametrize("width", [400, 1400])
@pytest.mark.parametrize("report", ["both", "bpb"])
def test_nothing_overlaps_or_is_cut(pages, browser, tmp_path, report, width) -> None:
    path = tmp_path / "report.html"
    path.write_text(pages[report], encoding="utf-8")
    browser.set_window_size(width, 1000)
    browser.get(path.as_uri())
    drawn = drawn_figures(browser, len(figures(pages[report])))
    assert all(d["w"] <= width for d in drawn)
    assert layout_faults(browser) == []
    assert console_errors(browser) == []


# Clicks the button labelled arguments[0] on every figure that has one.
CLICK = """
document.querySelectorAll('.updatemenu-button').forEach(b => {
  if (b.textContent === arguments[0]) b.dispatchEvent(new MouseEvent('click', {bubbles: true}));
});
"""
AXIS_TYPES = """
return Object.fromEntries(Array.from(document.querySelectorAll('.js-plotly-plot'))
  .map(gd => [gd.dataset.figure, gd._fullLayout.yaxis.type]));
"""


@pytest.mark.parametrize("report", ["both", "loss"])
def test_log_y_switches_and_still_fits(pages, browser, tmp_path, report) -> None:
    """The learning rate has the switch too; on a log axis of a few decades (or of one
    point) plotly's own tick labels must not overlap."""
    path = tmp_path / "report.html"
    path.write_text(pages[report], encoding="utf-8")
    browser.set_window_size(400, 1000)
    browser.get(path.as_uri())
    specs = figures(pages[report])
    drawn_figures(browser, len(specs))
    switched = [n for n, s in specs.items() if s["layout"].get("updatemenus")]
    assert "lr" in switched and "throughput" not in switched
    for label, kind in (("log y", "log"), ("linear y", "linear")):
        browser.execute_script(CLICK, label)
        assert wait_for(
            lambda kind=kind: {browser.execute_script(AXIS_TYPES)[n] for n in switched} == {kind}
        )
        assert layout_faults(browser) == [], label
