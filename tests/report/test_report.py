"""The HTML report: escaping, curves, target line, confirming marks, phase bars, browser."""

from __future__ import annotations

import html
import math
from functools import partial
from pathlib import Path

import pytest

from cli_runner import ledgerlm
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.compare import NO_TEST, RULE
from ledgerlm.report.run_report import eval_seconds, nice_ticks, render_report
from ledgerlm.workspace import Workspace
from report_helpers import SVG, by_class, console_errors, headless_chromium, svgs
from seed_ledger import seed_run

EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def ledger_ws(tmp_path_factory) -> tuple[Path, list[str]]:
    """A workspace whose ledger holds A, D (SPEC T4), a run that never reaches the target
    and a run named like a script, with a recipe value that is markup too; each run ends
    with a checkpoint phase."""
    ws = tmp_path_factory.mktemp("report")
    base = {"data": {"domain": "web"}, "train": {"seed": 0, "lr": 1e-3}}
    with Ledger(Workspace(ws).ledger_path) as led:
        run = partial(seed_run, led, checkpoint=True)
        ids = [
            run("a", base, steps=2000, sec_per_step=1.0, cross_step=2000),
            run("d", base, steps=2000, sec_per_step=0.9, cross_step=1200, prep=300),
            run("slow", base, steps=1000, sec_per_step=1.0, cross_step=5000),
            run(
                EVIL,
                {"data": {"domain": "<img src=x onerror=alert(2)>"}, "train": {"seed": 1}},
                steps=1500,
                sec_per_step=0.5,
                cross_step=1000,
            ),
        ]
    return ws, ids


@pytest.fixture(scope="module")
def summaries(ledger_ws) -> list[dict]:
    ws, ids = ledger_ws
    with Ledger(Workspace(ws).ledger_path) as led:
        return [led.run_summary(r) for r in ids]


@pytest.fixture(scope="module")
def page(summaries) -> str:
    return render_report(summaries)


def test_text_from_the_ledger_is_escaped(page: str, summaries) -> None:
    evil_id = summaries[3]["run"]["id"]
    assert evil_id.startswith(EVIL)
    assert "<script" not in page.lower()  # the page has no scripts at all
    assert "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page  # in the comparison's recipe diff
    # In attributes too: the series of that run carries its id, escaped, as data-run.
    line = svgs(page)[0]
    assert evil_id in [g.get("data-run") for g in by_class(line, "series")]


def test_one_series_per_run_on_each_loss_chart(page: str, summaries) -> None:
    charts = svgs(page)
    assert [c.get("data-axis") for c in charts] == ["seconds", "tokens", "updates", "phases"]
    ids = [s["run"]["id"] for s in summaries]
    for chart in charts[:3]:
        series = by_class(chart, "series")
        assert [g.get("data-run") for g in series] == ids
        for g, s in zip(series, summaries, strict=True):
            assert len(g.findall(f"{SVG}circle")) == len(s["evaluations"])
            assert g.find(f"{SVG}polyline") is not None


def test_target_line_on_each_loss_chart(page: str) -> None:
    for chart in svgs(page)[:3]:
        (target,) = by_class(chart, "target")
        line = target.find(f"{SVG}line")
        assert line.get("y1") == line.get("y2")
        assert "".join(target.find(f"{SVG}text").itertext()) == "target 3"
        # The line sits where a point of loss exactly 3.0 sits: A confirms at 3.0.
        a_points = by_class(chart, "series")[0].findall(f"{SVG}circle")
        assert a_points[-1].get("cy") == line.get("y1")


def test_confirming_evaluation_is_marked(page: str, summaries) -> None:
    ids = [s["run"]["id"] for s in summaries]
    expected_index = {ids[0]: 3, ids[1]: 2, ids[3]: 1}  # A at 2000, D at 1500, evil at 1000
    for chart in svgs(page)[:3]:
        marks = by_class(chart, "confirm")
        assert [m.get("data-run") for m in marks] == [ids[0], ids[1], ids[3]]  # not "slow"
        series = {g.get("data-run"): g for g in by_class(chart, "series")}
        for mark in marks:
            ring = mark.find(f"{SVG}circle")
            point = series[mark.get("data-run")].findall(f"{SVG}circle")[
                expected_index[mark.get("data-run")]
            ]
            assert (ring.get("cx"), ring.get("cy")) == (point.get("cx"), point.get("cy"))
            assert "target confirmed at step" in "".join(mark.find(f"{SVG}title").itertext())


def test_time_axis_is_the_ledger_sum_that_time_to_target_is_made_of(summaries) -> None:
    a, d = summaries[0], summaries[1]
    assert eval_seconds(a) == pytest.approx([520, 1040, 1560, 2080])
    assert eval_seconds(d) == pytest.approx([770, 1240, 1710, 2180])
    assert eval_seconds(d)[2] == pytest.approx(d["time_to_target"]["seconds"])


def test_phase_bars(page: str, summaries) -> None:
    bars = svgs(page)[3]
    groups = by_class(bars, "bar")
    assert [g.get("data-run") for g in groups] == [s["run"]["id"] for s in summaries]
    d_kinds = [r.get("data-phase") for r in by_class(groups[1], "phase")]
    assert d_kinds == ["prep", "train", "eval", "checkpoint"]
    widths = {r.get("data-phase"): float(r.get("width")) for r in by_class(groups[1], "phase")}
    assert widths["train"] / widths["prep"] == pytest.approx(1800 / 300, rel=1e-2)
    assert len(by_class(bars, "ttt")) == 3
    assert "target not reached" in "".join(bars.itertext())


def test_comparison_table_and_rules(page: str) -> None:
    assert '<table class="compare">' in page
    for text in ("baseline", "recipe", "not comparable", "fewer steps to target (1500 vs 2000)"):
        assert text in page
    assert NO_TEST in page
    assert html.escape(RULE) in page


def test_gaps_and_edge_cases(summaries) -> None:
    with pytest.raises(ValueError, match="at least one run"):
        render_report([])
    broken = {**summaries[0], "evaluations": [dict(e) for e in summaries[0]["evaluations"]]}
    broken["evaluations"][1]["metrics"] = {"val_loss": math.nan}
    html = render_report([broken])
    (series,) = by_class(svgs(html)[0], "series")
    assert len(series.findall(f"{SVG}circle")) == 3  # the failed measurement is a gap
    assert "nan" not in html.lower()
    assert nice_ticks(0, 2080) == [0, 500, 1000, 1500, 2000]
    assert nice_ticks(2.95, 4.6)[0] == pytest.approx(3.0)


def test_cli_writes_the_report(ledger_ws, tmp_path: Path) -> None:
    ws, ids = ledger_ws
    out = tmp_path / "sub" / "report.html"
    proc = ledgerlm("report", ids[0], ids[1], "-o", str(out), "-w", str(ws))  # raises on failure
    assert f"wrote {out} (2 run(s))" in proc.stdout
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert ids[0] in text and ids[1] in text and ids[2] not in text


# -- in a real browser --------------------------------------------------------------------


def test_report_renders_in_headless_chromium(page: str, summaries, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    driver = headless_chromium()
    try:
        driver.get(path.as_uri())
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.chart')).map(s => {"
            " const r = s.getBoundingClientRect();"
            " return {axis: s.dataset.axis, w: r.width, h: r.height,"
            "  series: s.querySelectorAll('g.series').length,"
            "  lines: Array.from(s.querySelectorAll('g.series polyline, g.bar rect'))"
            "   .map(e => e.getBoundingClientRect().width).filter(w => w > 0).length}; })"
        )
        assert [b["axis"] for b in boxes] == ["seconds", "tokens", "updates", "phases"]
        for box in boxes:
            assert box["w"] > 100 and box["h"] > 100, box
            assert box["lines"] > 0, box
        assert [b["series"] for b in boxes[:3]] == [len(summaries)] * 3
        # The script-named run is text on the page, not code: no alert, shown verbatim.
        assert driver.execute_script("return document.scripts.length") == 0
        assert EVIL in driver.find_element("tag name", "body").text
        assert console_errors(driver) == []
        # The check can fail: an error on the console is seen by the same log.
        driver.execute_script("console.error('probe')")
        assert any("probe" in e["message"] for e in driver.get_log("browser"))
    finally:
        driver.quit()
