"""The scaling-law report: frontier with its bootstrap band, isoFLOP profiles, residuals;
units, escaping; a real browser; Epoch AI's reconstruction of Hoffmann et al.'s 240 runs."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ledgerlm.report.scaling_report import render_scaling_report
from ledgerlm.scaling.allocate import compute_optimal
from ledgerlm.scaling.fit import ScalingLaw, isoflop_fit
from ledgerlm.scaling.law import LawParams, flops
from reference_data import reference_points
from report_helpers import (
    alerts,
    axis_titles,
    console_errors,
    drawn_figures,
    figures,
    has_unit,
    headless_chromium,
    layout_faults,
    traces,
    without_plotlyjs,
)

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


def chart(page: str, name: str) -> dict:
    return figures(page)[name]


def shape(spec: dict, name: str) -> dict:
    (found,) = [s for s in spec["layout"].get("shapes", []) if s.get("name") == name]
    return found


# ----------------------------------------------------------------------------- the page


def test_a_self_contained_page_with_three_figures(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert list(figures(page)) == ["frontier", "isoflop", "residuals"]
    assert 'src="http' not in page
    own = without_plotlyjs(page)  # plotly.js is inlined once: nothing is fetched
    for resource in ("src=", 'href="http', "url(", "@import"):
        assert resource not in own
    assert own.count("<script") == 2 + 3  # plotly.js, three JSON blocks, the drawing


def test_title_with_markup_is_escaped(page: str) -> None:
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;fit&lt;/b&gt;"
    assert f"<title>{escaped}</title>" in page
    assert f"<h1>{escaped}</h1>" in page
    assert "<b>fit" not in page


def test_units_on_every_axis(page: str) -> None:
    titles = {name: axis_titles(spec) for name, spec in figures(page).items()}
    assert titles == {
        "frontier": {"xaxis": "training compute C = 6ND (FLOPs)", "yaxis": "loss (nat/token)"},
        "isoflop": {"xaxis": "parameters N", "yaxis": "loss (nat/token)"},
        "residuals": {
            "xaxis": "training compute C = 6ND (FLOPs)",
            "yaxis": "log L - log L_hat (ln of loss ratio)",
        },
    }
    for axes in titles.values():
        assert all(has_unit(title) for title in axes.values())
    for name, spec in figures(page).items():
        assert spec["layout"]["xaxis"]["type"] == "log", name  # log axes, as before
        assert spec["config"]["responsive"] is True and "width" not in spec["layout"]


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
    N, D, loss = fitted["points"]
    spec = chart(page, "frontier")
    (points,) = traces(spec, "points")
    assert len(points["x"]) == N.size
    C = flops(N, D)
    assert points["x"] == pytest.approx(C) and points["y"] == pytest.approx(loss)
    edges = {edge: shape(spec, f"range-{edge}") for edge in ("min", "max")}
    for edge in edges.values():
        assert edge["x0"] == edge["x1"] and (edge["yref"], edge["y0"], edge["y1"]) == (
            "paper",
            0,
            1,
        )
    # The runs with the least and the most compute sit on the fitted range's edges.
    assert points["x"][int(np.argmin(C))] == edges["min"]["x0"]
    assert points["x"][int(np.argmax(C))] == edges["max"]["x0"]
    lines = traces(spec, "frontier")
    assert [tr["meta"]["part"] for tr in lines] == ["extrapolated", "fit", "extrapolated"]
    below, inside, above = (list(zip(tr["x"], tr["y"], strict=True)) for tr in lines)
    assert (inside[0][0], inside[-1][0]) == (edges["min"]["x0"], edges["max"]["x0"])
    assert below[-1] == inside[0] and inside[-1] == above[0]  # one unbroken line
    assert max(x for x, _ in below) == edges["min"]["x0"]
    assert min(x for x, _ in above) == edges["max"]["x0"]
    for tr, dashed in zip(lines, (True, False, True), strict=True):
        assert (tr["line"]["dash"] == "dash") == dashed
    # one legend entry for the fitted part and one for both extrapolated parts
    assert [tr["showlegend"] for tr in lines] == [True, True, False]


def band_edges(spec) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    (band,) = traces(spec, "band")
    assert band["fill"] == "toself"
    pts = list(zip(band["x"], band["y"], strict=True))
    n = len(pts) // 2
    return pts[:n], pts[n:][::-1]  # upper (high loss) and lower edge, both left to right


def test_band_contains_the_point_frontier(page: str) -> None:
    spec = chart(page, "frontier")
    upper, lower = band_edges(spec)
    assert [x for x, _ in upper] == [x for x, _ in lower]
    frontier = [pt for tr in traces(spec, "frontier") for pt in zip(tr["x"], tr["y"], strict=True)]
    at = {x: (hi, lo) for (x, hi), (_, lo) in zip(upper, lower, strict=True)}
    assert {x for x, _ in frontier} == set(at)  # the band spans the whole drawn frontier
    for x, y in frontier:
        hi, lo = at[x]
        assert lo - 1e-12 <= y <= hi + 1e-12, (x, y, hi, lo)
    widths = [hi - lo for (_, hi), (_, lo) in zip(upper, lower, strict=True)]
    assert min(widths) > 0
    # Extrapolating is less certain: the band is wider at both far ends than mid-range.
    mid = widths[len(widths) // 2]
    assert widths[0] > mid and widths[-1] > mid


def test_bootstrap_object_or_samples_and_no_band_without(fitted, page: str) -> None:
    f = fitted
    same = render_scaling_report(*f["points"], f["law"], f["boot"].samples, f["iso"], title=EVIL)
    assert same == page
    bare = render_scaling_report(*f["points"], f["law"])
    assert traces(chart(bare, "frontier"), "band") == []
    assert "No bootstrap samples were given" in bare
    assert list(figures(bare)) == ["frontier", "residuals"]
    assert "No isoFLOP fit was given" in bare
    assert len(traces(chart(bare, "frontier"), "frontier")) == 3


# ----------------------------------------------------------------------------- (2) isoFLOP


def check_isoflop_groups(spec, iso) -> None:
    points = traces(spec, "isoflop-points")
    parabolas = {tr["meta"]["level"]: tr for tr in traces(spec, "parabola")}
    minima = {tr["meta"]["level"]: tr for tr in traces(spec, "minimum")}
    assert len(points) == len(iso.profiles)
    for pts, p in zip(points, iso.profiles, strict=True):
        level = pts["meta"]["level"]
        assert level == pytest.approx(p.level)
        assert len(pts["x"]) == p.n
        curve = parabolas[level]  # one parabola per isoFLOP group, in its legend group
        assert curve["legendgroup"] == pts["legendgroup"] == minima[level]["legendgroup"]
        ((n_opt,), (l_opt,)) = minima[level]["x"], minima[level]["y"]
        assert (n_opt, l_opt) == pytest.approx((p.N_opt, p.L_opt))
        # The diamond is the parabola's minimum: no sampled point of the curve lies below
        # it, and it is inside the curve's N range, within one sample of its lowest point.
        assert min(curve["y"]) >= l_opt - 1e-9
        assert curve["x"][0] <= n_opt <= curve["x"][-1]
        lowest = curve["x"][int(np.argmin(curve["y"]))]
        step = math.log(curve["x"][1] / curve["x"][0])
        assert abs(math.log(lowest / n_opt)) <= step + 1e-9
        assert (curve["line"]["dash"] == "dash") == (not pts["meta"]["used"])
    (law,) = traces(spec, "law-optimum")
    assert len(law["x"]) == len(iso.profiles)
    (optima,) = traces(spec, "optima")
    assert len(optima["x"]) == sum(iso.used)


def test_one_parabola_per_isoflop_group(page: str, fitted) -> None:
    iso = fitted["iso"]
    assert [p.n for p in iso.profiles] == [PER_BUDGET] * len(BUDGETS)
    assert all(iso.used)
    check_isoflop_groups(chart(page, "isoflop"), iso)


def test_isoflop_groups_from_given_budgets(fitted) -> None:
    f = fitted
    iso = isoflop_fit(*f["points"], C=f["C"])  # the 3 runs at 2e19 are too few for a profile
    html = render_scaling_report(*f["points"], f["law"], isoflop=iso)
    check_isoflop_groups(chart(html, "isoflop"), iso)


def test_each_profile_draws_the_points_its_fit_grouped(fitted) -> None:
    f = fitted
    iso = f["iso"]
    # the fit keeps each point's budget: move one point to another profile's label and
    # the page follows the fit, not a rule of its own
    labels = list(iso.labels)
    first, second = iso.profiles[0], iso.profiles[1]
    moved = labels.index(first.level)
    labels[moved] = second.level
    other = replace(iso, labels=tuple(labels))
    html = render_scaling_report(*f["points"], f["law"], isoflop=other)
    groups = traces(chart(html, "isoflop"), "isoflop-points")
    assert [len(g["x"]) for g in groups][:2] == [first.n - 1, second.n + 1]


# ----------------------------------------------------------------------------- (3) residuals


def test_residuals_against_a_zero_line(page: str, fitted) -> None:
    spec = chart(page, "residuals")
    zero = shape(spec, "zero")
    assert zero["y0"] == zero["y1"] == 0 and (zero["x0"], zero["x1"]) == (0, 1)
    (points,) = traces(spec, "points")
    residuals = fitted["law"].residuals_
    assert points["y"] == pytest.approx(residuals)  # a run worse than the law sits above
    lo, hi = spec["layout"]["yaxis"]["range"]
    assert lo == -hi and hi > max(abs(residuals))  # symmetric about the zero line


# ----------------------------------------------------------------------------- reference data


def test_reference_csv_renders_with_its_240_points(reference) -> None:
    (N, _, _), iso, html = reference
    assert N.size == 240
    for name in ("frontier", "residuals"):
        (points,) = traces(chart(html, name), "points")
        assert len(points["x"]) == 240
    spec = chart(html, "isoflop")
    groups = traces(spec, "isoflop-points")
    assert len(groups) == len(iso.profiles) >= 9
    assert sum(len(g["x"]) for g in groups) == sum(p.n for p in iso.profiles)
    assert len(traces(chart(html, "frontier"), "band")) == 1
    assert not any(y is None for tr in spec["data"] for y in tr["y"])
    assert "the fit grouped them otherwise" not in html  # the drawn groups are the fit's


# ----------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def driver():
    d = headless_chromium()
    yield d
    d.quit()


@pytest.mark.parametrize("which", ["synthetic", "reference"])
def test_renders_in_headless_chromium(which: str, request, driver, tmp_path: Path) -> None:
    if which == "reference":
        (N, _, _), iso, html = request.getfixturevalue("reference")
        title = "Chinchilla (Epoch AI)"
    else:
        f = request.getfixturevalue("fitted")
        N, iso = f["points"][0], f["iso"]
        html, title = request.getfixturevalue("page"), EVIL
    specs = figures(html)
    path = tmp_path / "scaling.html"
    path.write_text(html, encoding="utf-8")
    console_errors(driver)  # start from an empty log
    driver.get(path.as_uri())
    drawn = drawn_figures(driver, len(specs))
    assert [d["name"] for d in drawn] == ["frontier", "isoflop", "residuals"]
    for d, spec in zip(drawn, specs.values(), strict=True):
        assert d["w"] > 300 and d["h"] > 150 and d["svgs"] >= 1, d["name"]
        assert d["drawn"] == d["traces"] == len(spec["data"]), d["name"]
        assert d["lines"] > 0 or d["name"] == "residuals", d["name"]
        assert d["xtitle"] == [axis_titles(spec)["xaxis"]]
    markers = [{s["role"]: s["points"] for s in d["scatter"] if s["role"] == "points"}
               for d in drawn]  # fmt: skip
    assert markers == [{"points": N.size}, {}, {"points": N.size}]
    iso_markers = [s["points"] for s in drawn[1]["scatter"] if s["role"] == "isoflop-points"]
    assert iso_markers == [p.n for p in iso.profiles]
    assert driver.execute_script("return document.scripts.length") == 2 + len(specs)
    assert driver.find_element("tag name", "h1").text == title  # markup shown as text
    assert alerts(driver) == []
    assert console_errors(driver) == []
    # The check can fail: an error on the console is seen by the same log.
    driver.execute_script("console.error('probe')")
    assert any("probe" in e["message"] for e in driver.get_log("browser"))


def test_nothing_overlaps_at_400_px(page: str, driver, tmp_path: Path) -> None:
    """No legend entry, button, axis title or tick label overlaps another or leaves its
    figure in a 400 px window."""
    path = tmp_path / "scaling.html"
    path.write_text(page, encoding="utf-8")
    driver.set_window_size(400, 1000)
    try:
        driver.get(path.as_uri())
        drawn_figures(driver, len(figures(page)))
        assert layout_faults(driver) == []
    finally:
        driver.set_window_size(1280, 1000)
