"""The scaling-law report: frontier with its bootstrap band, isoFLOP profiles, residuals;
escaping; a real browser; Epoch AI's reconstruction of Hoffmann et al.'s 240 runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from ledgerlm.report.scaling_report import render_scaling_report
from ledgerlm.scaling.allocate import compute_optimal
from ledgerlm.scaling.fit import ScalingLaw, isoflop_fit
from ledgerlm.scaling.law import LawParams, flops
from reference_data import reference_points
from report_helpers import SVG, by_class, console_errors, headless_chromium, svgs

# /work/main/tests/report/test_scaling_report.py -> parents[3] = /work, beside the repository.

TRUE = LawParams(E=1.8, A=450.0, B=2100.0, alpha=0.34, beta=0.37)
BUDGETS = (1e18, 1e19, 1e20, 1e21)
PER_BUDGET = 7
EVIL = "<script>alert(1)</script> & <b>fit</b>"


def synthetic_points():
    """isoFLOP profiles from known params: 7 sizes around the optimum at each of 4
    budgets, plus 3 runs at C = 2e19 (between snapping levels, so in no profile);
    0.5% log-normal noise."""
    C = np.repeat(BUDGETS, PER_BUDGET)
    N = (compute_optimal(TRUE, np.array(BUDGETS))[0][:, None] * np.logspace(-0.8, 0.8, 7)).ravel()
    N = np.concatenate([N, compute_optimal(TRUE, 2e19)[0] * np.array([0.5, 1.0, 2.0])])
    C = np.concatenate([C, [2e19] * 3])
    D = C / (6.0 * N)
    loss = TRUE.predict(N, D) * np.exp(np.random.default_rng(0).normal(0, 0.005, N.size))
    return N, D, loss, C


@pytest.fixture(scope="module")
def fitted():
    N, D, loss, C = synthetic_points()
    law = ScalingLaw().fit(N, D, loss)
    return {
        "points": (N, D, loss),
        "C": C,
        "law": law,
        "boot": law.bootstrap(60, seed=0),
        "iso": isoflop_fit(N, D, loss),
    }


@pytest.fixture(scope="module")
def page(fitted) -> str:
    f = fitted
    return render_scaling_report(*f["points"], f["law"], f["boot"], f["iso"], title=EVIL)


@pytest.fixture(scope="module")
def reference():
    points = reference_points()
    law = ScalingLaw().fit(*points)
    iso = isoflop_fit(*points)
    html = render_scaling_report(
        *points, law, law.bootstrap(20, seed=0), iso, title="Chinchilla (Epoch AI)"
    )
    return points, iso, html


def chart(page: str, axis: str):
    (svg,) = [s for s in svgs(page) if s.get("data-axis") == axis]
    return svg


def xy(polyline) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]


# ----------------------------------------------------------------------------- the page


def test_a_self_contained_page_with_three_charts(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert [s.get("data-axis") for s in svgs(page)] == ["frontier", "isoflop", "residuals"]
    assert "<script" not in page.lower()
    for resource in ("src=", 'href="http', "url(", "@import"):
        assert resource not in page


def test_title_with_markup_is_escaped(page: str) -> None:
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;fit&lt;/b&gt;"
    assert f"<title>{escaped}</title>" in page
    assert f"<h1>{escaped}</h1>" in page
    assert "<b>fit" not in page


def test_inputs_are_checked(fitted) -> None:
    N, D, loss = fitted["points"]
    with pytest.raises(ValueError, match="not fitted"):
        render_scaling_report(N, D, loss, ScalingLaw())
    with pytest.raises(ValueError, match="do not match"):
        render_scaling_report(N[:-1], D[:-1], loss[:-1], fitted["law"])
    with pytest.raises(ValueError, match="do not match"):  # the same points, another order
        render_scaling_report(N[::-1], D[::-1], loss[::-1], fitted["law"])
    with pytest.raises(ValueError, match="differ in length"):
        render_scaling_report(N, D[:-1], loss, fitted["law"])


# ----------------------------------------------------------------------------- (1) frontier


def test_points_frontier_and_fitted_range(page: str, fitted) -> None:
    N, D, _ = fitted["points"]
    svg = chart(page, "frontier")
    (points,) = by_class(svg, "points")
    dots = points.findall(f"{SVG}circle")
    assert len(dots) == N.size
    edges = {
        g.get("data-edge"): float(g.find(f"{SVG}line").get("x1"))
        for g in by_class(svg, "range-edge")
    }
    C = flops(N, D)
    # The runs with the least and the most compute sit on the fitted range's edges.
    assert float(dots[int(np.argmin(C))].get("cx")) == edges["min"]
    assert float(dots[int(np.argmax(C))].get("cx")) == edges["max"]
    (frontier,) = by_class(svg, "frontier")
    lines = frontier.findall(f"{SVG}polyline")
    assert [p.get("class") for p in lines] == ["extrapolated", "fit", "extrapolated"]
    below, inside, above = (xy(p) for p in lines)
    assert (inside[0][0], inside[-1][0]) == (edges["min"], edges["max"])
    assert below[-1] == inside[0] and inside[-1] == above[0]  # one unbroken line
    assert max(x for x, _ in below) == edges["min"] and min(x for x, _ in above) == edges["max"]
    for line, dashed in zip(lines, (True, False, True), strict=True):
        assert (line.get("stroke-dasharray") is not None) == dashed


def band_edges(svg) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    (band,) = by_class(svg, "band")
    pts = [tuple(map(float, p.split(","))) for p in band.get("points").split()]
    n = len(pts) // 2
    return pts[:n], pts[n:][::-1]  # upper (high loss) and lower edge, both left to right


def test_band_contains_the_point_frontier(page: str) -> None:
    svg = chart(page, "frontier")
    upper, lower = band_edges(svg)
    assert [x for x, _ in upper] == [x for x, _ in lower]
    frontier = [
        pt for line in by_class(svg, "frontier")[0].findall(f"{SVG}polyline") for pt in xy(line)
    ]
    at = {x: (hi, lo) for (x, hi), (_, lo) in zip(upper, lower, strict=True)}
    assert {x for x, _ in frontier} == set(at)  # the band spans the whole drawn frontier
    for x, y in frontier:
        hi_px, lo_px = at[x]  # y grows downwards: the upper edge has the smaller y
        assert hi_px <= y <= lo_px, (x, y, hi_px, lo_px)
    widths = [lo - hi for (_, hi), (_, lo) in zip(upper, lower, strict=True)]
    assert min(widths) > 0
    # Extrapolating is less certain: the band is wider at both far ends than mid-range.
    mid = widths[len(widths) // 2]
    assert widths[0] > mid and widths[-1] > mid


def test_bootstrap_object_or_samples_and_no_band_without(fitted, page: str) -> None:
    f = fitted
    same = render_scaling_report(*f["points"], f["law"], f["boot"].samples, f["iso"], title=EVIL)
    assert same == page
    bare = render_scaling_report(*f["points"], f["law"])
    assert by_class(chart(bare, "frontier"), "band") == []
    assert "No bootstrap samples were given" in bare
    assert [s.get("data-axis") for s in svgs(bare)] == ["frontier", "residuals"]
    assert "No isoFLOP fit was given" in bare
    assert len(by_class(chart(bare, "frontier"), "frontier")) == 1


# ----------------------------------------------------------------------------- (2) isoFLOP


def check_isoflop_groups(svg, iso) -> None:
    groups = by_class(svg, "isoflop")
    assert len(groups) == len(iso.profiles)
    for g, p in zip(groups, iso.profiles, strict=True):
        assert float(g.get("data-level")) == pytest.approx(p.level)
        (parabola,) = g.findall(f"{SVG}polyline")  # one polyline per isoFLOP group
        assert len(g.findall(f"{SVG}circle")) == p.n
        curve = xy(parabola)
        (minimum,) = by_class(g, "minimum")
        # The diamond is drawn around the parabola's minimum: no sampled point of the
        # curve lies below it (larger y), and it is inside the curve's N range.
        corners = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", minimum.get("d"))]
        cx, cy = corners[0], corners[3]  # top corner's x, right corner's y
        assert max(y for _, y in curve) <= cy + 0.11
        assert curve[0][0] <= cx <= curve[-1][0]
        lowest_x = max(curve, key=lambda pt: pt[1])[0]
        assert abs(lowest_x - cx) <= curve[1][0] - curve[0][0] + 0.11  # within one sample
    assert len(by_class(svg, "law-optimum")) == len(iso.profiles)
    (optima,) = by_class(svg, "optima")
    assert len(xy(optima)) == sum(iso.used)


def test_one_polyline_per_isoflop_group(page: str, fitted) -> None:
    iso = fitted["iso"]
    assert [p.n for p in iso.profiles] == [PER_BUDGET] * len(BUDGETS)
    assert all(iso.used)
    check_isoflop_groups(chart(page, "isoflop"), iso)


def test_isoflop_groups_from_given_budgets(fitted) -> None:
    f = fitted
    iso = isoflop_fit(*f["points"], C=f["C"])  # the 3 runs at 2e19 are too few for a profile
    html = render_scaling_report(*f["points"], f["law"], isoflop=iso, isoflop_C=f["C"])
    check_isoflop_groups(chart(html, "isoflop"), iso)


# ----------------------------------------------------------------------------- (3) residuals


def test_residuals_against_a_zero_line(page: str, fitted) -> None:
    svg = chart(page, "residuals")
    (zero,) = by_class(svg, "zero")
    y0 = float(zero.get("y1"))
    assert zero.get("y2") == zero.get("y1")
    (points,) = by_class(svg, "points")
    dots = points.findall(f"{SVG}circle")
    residuals = fitted["law"].residuals_
    assert len(dots) == residuals.size
    for dot, r in zip(dots, residuals, strict=True):
        y = float(dot.get("cy"))
        assert (y <= y0) if r > 0 else (y >= y0)  # a run worse than the law sits above
    ticks = ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]
    assert "0" in ticks


# ----------------------------------------------------------------------------- reference data


def test_reference_csv_renders_with_its_240_points(reference) -> None:
    (N, _, _), iso, html = reference
    assert N.size == 240
    for axis in ("frontier", "residuals"):
        (points,) = by_class(chart(html, axis), "points")
        assert len(points.findall(f"{SVG}circle")) == 240
    svg = chart(html, "isoflop")
    groups = by_class(svg, "isoflop")
    assert len(groups) == len(iso.profiles) == 9
    assert sum(len(g.findall(f"{SVG}circle")) for g in groups) == sum(p.n for p in iso.profiles)
    assert len(by_class(chart(html, "frontier"), "band")) == 1
    assert not any(math.isnan(float(c.get("cy"))) for c in svg.iter(f"{SVG}circle"))


# ----------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def driver():
    d = headless_chromium()
    yield d
    d.quit()


@pytest.mark.parametrize("which", ["synthetic", "reference"])
def test_renders_in_headless_chromium(which: str, request, driver, tmp_path: Path) -> None:
    if which == "reference":
        (N, _, _), _, html = request.getfixturevalue("reference")
        title = "Chinchilla (Epoch AI)"
    else:
        N = request.getfixturevalue("fitted")["points"][0]
        html, title = request.getfixturevalue("page"), EVIL
    path = tmp_path / "scaling.html"
    path.write_text(html, encoding="utf-8")
    console_errors(driver)  # start from an empty log
    driver.get(path.as_uri())
    boxes = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart')).map(s => {"
        " const r = s.getBoundingClientRect();"
        " const drawn = sel => Array.from(s.querySelectorAll(sel)).filter(e => {"
        "  const b = e.getBoundingClientRect(); return b.width > 0 && b.height > 0; }).length;"
        " return {axis: s.dataset.axis, w: r.width, h: r.height,"
        "  lines: drawn('polyline, polygon'), dots: drawn('g.points circle')}; })"
    )
    assert [b["axis"] for b in boxes] == ["frontier", "isoflop", "residuals"]
    for box in boxes:
        assert box["w"] > 100 and box["h"] > 100, box
        assert box["lines"] > 0 or box["axis"] == "residuals", box
    assert [b["dots"] for b in boxes] == [N.size, 0, N.size]
    assert driver.execute_script("return document.scripts.length") == 0
    assert driver.find_element("tag name", "h1").text == title  # markup shown as text
    assert console_errors(driver) == []
    # The check can fail: an error on the console is seen by the same log.
    driver.execute_script("console.error('probe')")
    assert any("probe" in e["message"] for e in driver.get_log("browser"))
