"""The HTML run report: escaping, validation curves, target line, confirming marks,
per-update panels (smoothing, throughput), legend labels, units, log-y switches, phase
bars, size, and a real browser."""

from __future__ import annotations

import html
import json
import math
import re
from functools import partial
from pathlib import Path

import pytest

from cli_runner import ledgerlm
from finite import assert_finite
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.compare import NO_TEST, RULE
from ledgerlm.ledger.events import RESOURCES
from ledgerlm.ledger.resources import held
from ledgerlm.report.plots import LOG_TICKS, lines
from ledgerlm.report.run.labels import recipe_labels
from ledgerlm.report.run.page import render_report
from ledgerlm.report.run.series import (
    MAX_POINTS,
    SMOOTHING,
    ema,
    eval_seconds,
    thin,
    tokens_per_second,
)
from ledgerlm.workspace import Workspace
from report_helpers import (
    alerts,
    axis_titles,
    console_errors,
    drawn_cleanly,
    drawn_figures,
    figure_blocks,
    figures,
    has_unit,
    headless_chromium,
    plotlyjs,
    traces,
    wait_for,
    without_plotlyjs,
)
from seed_ledger import TARGETS_PER_STEP, TOKENS_PER_STEP, seed_run

EVIL = "<script>alert(1)</script>"
VALIDATION = ["val-seconds", "val-tokens", "val-updates"]
PER_UPDATE = ["train-loss", "lr", "grad-norm", "throughput"]


def esc(text: str) -> str:
    """How ledger text is written into plotly text: ``<``, ``>``, ``&`` as entities."""
    return html.escape(text, quote=False)


def hover(values: list[float]) -> list[float]:
    """``values`` as a figure holds them: to 6 significant digits, so compared exactly."""
    return [float(f"{v:.6g}") for v in values]


def update_rows(n: int, sec_per_step: float) -> list[dict]:
    """Per-update rows: a noisy falling loss, a warmup, and every 10th row without its
    wall seconds (an update whose time was not measured)."""
    return [
        {
            "step": s,
            "tokens": TOKENS_PER_STEP,
            "targets": TARGETS_PER_STEP,
            "loss": 3.0 + 4.0 / math.sqrt(s) + (0.1 if s % 2 else -0.1),
            "grad_norm": 1.0 + 0.5 * (s % 3),
            "lr": 1e-3 * min(1.0, s / 100),
            "seconds": None if s % 10 == 0 else sec_per_step,
        }
        for s in range(1, n + 1)
    ]


@pytest.fixture(scope="module")
def ledger_ws(tmp_path_factory) -> tuple[Path, list[str]]:
    """A workspace whose ledger holds A, D (requirement T4), a run that never reaches the target
    and a run named like a script, with a recipe value that is markup too; each run ends
    with a checkpoint phase and has its per-update rows."""
    ws = tmp_path_factory.mktemp("report")
    base = {"data": {"domain": "web"}, "train": {"seed": 0, "lr": 1e-3}}
    with Ledger(Workspace(ws).ledger_path) as led:
        run = partial(seed_run, led, checkpoint=True)
        specs = [
            ("a", base, 2000, 1.0, 2000),
            ("d", base, 2000, 0.9, 1200),
            ("slow", base, 1000, 1.0, 5000),
            (
                EVIL,
                {"data": {"domain": "<img src=x onerror=alert(2)>"}, "train": {"seed": 1}},
                1500,
                0.5,
                1000,
            ),
        ]
        ids = []
        for name, recipe, steps, sec, cross in specs:
            prep = 300 if name == "d" else 0.0
            run_id = run(name, recipe, steps=steps, sec_per_step=sec, cross_step=cross, prep=prep)
            led.add_steps(run_id, update_rows(steps, sec))
            ids.append(run_id)
    return ws, ids


@pytest.fixture(scope="module")
def summaries(ledger_ws) -> list[dict]:
    ws, ids = ledger_ws
    with Ledger(Workspace(ws).ledger_path) as led:
        return [led.run_summary(r) for r in ids]


@pytest.fixture(scope="module")
def steps(ledger_ws) -> dict[str, list[dict]]:
    ws, ids = ledger_ws
    with Ledger(Workspace(ws).ledger_path) as led:
        return {r: led.steps(r) for r in ids}


@pytest.fixture(scope="module")
def page(summaries, steps) -> str:
    return render_report(summaries, steps)


@pytest.fixture(scope="module")
def specs(page) -> dict[str, dict]:
    return figures(page)


def ids_of(summaries) -> list[str]:
    return [s["run"]["id"] for s in summaries]


# ----------------------------------------------------------------------------- escaping


def test_text_from_the_ledger_is_escaped(page: str, specs, summaries) -> None:
    evil_id = summaries[3]["run"]["id"]
    assert evil_id.startswith(EVIL)
    own = without_plotlyjs(page)
    # The only scripts are the report's: plotly.js, one JSON block per figure (a data
    # block no browser runs) and the drawing script.
    tags = own.split("<script")[1:]
    assert len(tags) == 2 + len(specs)
    assert sum(t.startswith(' type="application/json" class="figure-spec"') for t in tags) == len(
        specs
    )
    assert "<img" not in own
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in own  # in the run list and the table
    assert "&lt;img src=x onerror=alert(2)&gt;" in own  # in the comparison's recipe diff
    # No JSON block holds a raw <, > or &: no string can end its <script> element.
    for text in figure_blocks(page).values():
        assert not {"<", ">", "&"} & set(text)
    # In plotly text the run id and its recipe value are entities, shown verbatim.
    (series,) = [tr for tr in traces(specs["val-tokens"], "series") if tr["meta"]["run"]
                 == esc(evil_id)]  # fmt: skip
    assert (
        series["name"]
        == esc("data.domain=<img src=x")
        + "<br>"
        + esc("onerror=alert(2)>, train.seed=1,")
        + "<br>train.lr=unset"
    )  # wrapped, escaped per line
    assert "%{meta.run}" in series["hovertemplate"]  # ledger text is never in a template
    for spec in specs.values():
        for tr in spec["data"]:
            assert EVIL not in tr.get("hovertemplate", "")
    assert esc(evil_id) in specs["phases"]["data"][0]["y"]


# ----------------------------------------------------------------------------- validation


def test_one_series_per_run_on_each_loss_chart(specs, summaries) -> None:
    assert list(specs) == [*VALIDATION, *PER_UPDATE, "phases"]  # no bpb measured
    for name in VALIDATION:
        series = traces(specs[name], "series")
        assert [tr["meta"]["run"] for tr in series] == [esc(i) for i in ids_of(summaries)]
        for tr, s in zip(series, summaries, strict=True):
            assert tr["mode"] == "lines+markers"
            assert len([y for y in tr["y"] if y is not None]) == len(s["evaluations"])
            assert "%{meta.run}" in tr["hovertemplate"]  # the run id on hover
    seconds = traces(specs["val-seconds"], "series")
    assert [tr["x"] for tr in seconds] == [eval_seconds(s) for s in summaries]
    tokens = traces(specs["val-tokens"], "series")[0]
    assert tokens["x"] == [e["tokens"] for e in summaries[0]["evaluations"]]


def test_target_line_on_each_loss_chart(specs) -> None:
    for name in VALIDATION:
        (target,) = specs[name]["layout"]["shapes"]
        assert target["y0"] == target["y1"] == 3.0
        assert (target["xref"], target["x0"], target["x1"]) == ("paper", 0, 1)
        assert target["line"]["dash"] == "dash"
        # named in the legend, not by a label that could sit outside the plot
        assert (target["name"], target["showlegend"]) == ("target 3", True)
        assert "label" not in target
        # A confirms at exactly 3.0: its last point sits on the line.
        assert traces(specs[name], "series")[0]["y"][-1] == target["y0"]


def test_confirming_evaluation_is_marked(specs, summaries) -> None:
    ids = ids_of(summaries)
    expected_index = {ids[0]: 3, ids[1]: 2, ids[3]: 1}  # A at 2000, D at 1500, evil at 1000
    for name in VALIDATION:
        marks = traces(specs[name], "confirm")
        assert [m["meta"]["run"] for m in marks] == [esc(ids[i]) for i in (0, 1, 3)]
        series = {tr["meta"]["run"]: tr for tr in traces(specs[name], "series")}
        for mark, run_id in zip(marks, (ids[0], ids[1], ids[3]), strict=True):
            point = expected_index[run_id]
            line = series[esc(run_id)]
            assert (mark["x"], mark["y"]) == ([line["x"][point]], [line["y"][point]])
            assert mark["marker"]["symbol"] == "circle-open"
            assert "target confirmed at step" in mark["hovertext"][0]
            assert mark["legendgroup"] == line["legendgroup"]  # hidden with its run


def test_time_axis_is_the_ledger_sum_that_time_to_target_is_made_of(summaries) -> None:
    a, d = summaries[0], summaries[1]
    assert eval_seconds(a) == pytest.approx([520, 1040, 1560, 2080])
    assert eval_seconds(d) == pytest.approx([770, 1240, 1710, 2180])
    assert eval_seconds(d)[2] == pytest.approx(d["time_to_target"]["seconds"])


def test_bits_per_byte_when_measured(summaries, steps) -> None:
    measured = [
        {
            **s,
            "evaluations": [
                {**e, "metrics": {**e["metrics"], "bpb": 1.0 + i / 10}}
                for i, e in enumerate(s["evaluations"])
            ],
        }
        for s in summaries[:2]
    ]
    specs = figures(render_report(measured, steps))
    assert list(specs) == [*VALIDATION, "bpb-tokens", *PER_UPDATE, "phases"]
    bpb = specs["bpb-tokens"]
    assert axis_titles(bpb) == {"xaxis": "tokens", "yaxis": "bits per byte (bit/byte)"}
    (first, _) = traces(bpb, "series")
    assert first["y"] == [1.0, 1.1, 1.2, 1.3]
    assert first["x"] == [e["tokens"] for e in summaries[0]["evaluations"]]
    assert "bit/byte" in first["meta"]["unit"]


# ----------------------------------------------------------------------------- per update


def test_ema_matches_known_values() -> None:
    # m1 = 0.5, m2 = 1.25, m3 = 2.125 over debias 0.5, 0.75, 0.875
    assert ema([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 5 / 3, 17 / 7])
    assert ema([1.0, None, math.nan, 3.0], 0.5) == pytest.approx([1.0, None, None, 7 / 3])
    assert ema([2.0] * 50, 0.9) == pytest.approx([2.0] * 50)  # debiased: no ramp from 0
    assert ema([4.0, 0.0, 8.0], 0.0) == [4.0, 0.0, 8.0]  # no smoothing
    # TensorBoard's recurrence written out, weight 0.9
    values, last, out = [5.0, 3.0, 4.0, 1.0, 2.0], 0.0, []
    for k, v in enumerate(values, 1):
        last = 0.9 * last + 0.1 * v
        out.append(last / (1 - 0.9**k))
    assert ema(values) == pytest.approx(out)
    assert SMOOTHING == 0.9
    with pytest.raises(ValueError, match="smoothing weight"):
        ema([1.0], 1.0)


def test_tokens_per_second_skips_rows_without_seconds() -> None:
    rows = [
        {"step": 1, "tokens": 4096, "seconds": 2.0},
        {"step": 2, "tokens": 4096, "seconds": None},
        {"step": 3, "tokens": 1000, "seconds": 0.5},
        {"step": 4, "tokens": 1000, "seconds": 0.0},
        {"step": 5, "tokens": 300},
    ]
    assert tokens_per_second(rows) == ([1, 3], [2048.0, 2000.0])


def test_training_loss_raw_and_smoothed(specs, summaries, steps) -> None:
    spec = specs["train-loss"]
    raw, smoothed = traces(spec, "raw"), traces(spec, "smoothed")
    assert [tr["meta"]["run"] for tr in smoothed] == [esc(i) for i in ids_of(summaries)]
    rows = steps[summaries[0]["run"]["id"]]
    assert raw[0]["x"] == smoothed[0]["x"] == [r["step"] for r in rows]
    assert raw[0]["y"] == hover([r["loss"] for r in rows])
    assert smoothed[0]["y"] == hover(ema([r["loss"] for r in rows]))
    assert raw[0]["opacity"] < 1 and "opacity" not in smoothed[0]  # faint raw line
    assert raw[0]["showlegend"] is False  # one legend entry per run, hiding both lines
    assert raw[0]["legendgroup"] == smoothed[0]["legendgroup"]
    # The smoothing damps the +-0.1 alternation of the raw loss.
    tail = slice(1000, 1100)
    assert max(raw[0]["y"][tail]) - min(raw[0]["y"][tail]) > 0.19
    assert max(smoothed[0]["y"][tail]) - min(smoothed[0]["y"][tail]) < 0.05


def test_learning_rate_grad_norm_and_throughput(specs, summaries, steps) -> None:
    rows = steps[summaries[1]["run"]["id"]]  # D: 0.9 s per update
    (_, lr, _, _) = traces(specs["lr"], "value")
    assert lr["y"] == hover([r["lr"] for r in rows])
    grad = traces(specs["grad-norm"], "raw")[1]
    assert grad["y"] == hover([r["grad_norm"] for r in rows])
    tput = traces(specs["throughput"], "raw")[1]
    assert tput["x"] == [r["step"] for r in rows if r["step"] % 10]  # no seconds: no point
    assert tput["y"] == hover([TOKENS_PER_STEP / 0.9] * len(tput["x"]))
    assert len(traces(specs["throughput"], "smoothed")) == len(summaries)


def test_per_update_panels_need_rows(summaries) -> None:
    specs = figures(page := render_report(summaries))
    assert list(specs) == [*VALIDATION, "phases"]
    assert "No per-update rows were given for these runs." in page


def test_long_runs_are_thinned_and_the_page_stays_small(summaries) -> None:
    n = 20_000
    run_id = summaries[0]["run"]["id"]
    long = render_report(summaries[:1], {run_id: update_rows(n, 0.25)})
    spec = figures(long)["train-loss"]
    raw, smoothed = traces(spec, "raw")[0], traces(spec, "smoothed")[0]
    assert len(raw["x"]) == MAX_POINTS and raw["x"][0] == 1 and raw["x"][-1] == n
    # The average runs over every update, not only over those drawn.
    full = ema([r["loss"] for r in update_rows(n, 0.25)])
    assert smoothed["y"] == hover([full[i] for i in thin(n)])
    assert f"more than {MAX_POINTS:,} updates" in long
    own = len(long.encode()) - len(plotlyjs().encode())
    assert own < 1_000_000, own  # plotly.js (~4.8 MB) plus under 1 MB of report
    assert thin(5, 10) == [0, 1, 2, 3, 4]
    assert thin(101, 11) == list(range(0, 101, 10))


def test_report_size_is_reasonable(page: str) -> None:
    size = len(page.encode())
    own = size - len(plotlyjs().encode())
    # 4 runs, 6,500 updates: the figures' data is a fraction of the inlined plotly.js.
    assert own < 1_000_000, own
    assert size < 6_000_000, size


# ----------------------------------------------------------------------------- legends


def summary(name: str, recipe: dict, run_id: str | None = None) -> dict:
    return {"run": {"id": run_id or f"{name}-20250101-000000-abcd", "name": name, "recipe": recipe}}


def test_recipe_labels_name_what_differs() -> None:
    lr = [summary("a", {"train": {"lr": v}, "model": {"d_model": 64}}) for v in (0.01, 0.02)]
    assert recipe_labels(lr) == ["train.lr=0.01", "train.lr=0.02"]
    both = [
        summary("a", {"name": "x", "train": {"lr": 0.01}, "model": {"d_model": 64}}),
        summary("b", {"name": "y", "train": {"lr": 0.02}, "model": {"d_model": 128}}),
    ]
    # the recipe name is left out when keys that matter differ
    assert recipe_labels(both) == ["train.lr=0.01, model.d_model=64",
                                   "train.lr=0.02, model.d_model=128"]  # fmt: skip
    named = [summary(n, {"name": n, "train": {"lr": 0.01}}) for n in ("base", "wide")]
    assert recipe_labels(named) == ["name=base", "name=wide"]
    # nothing differs (where a run logs does not count): the run's name, else its id
    logs = [summary(n, {"train": {"lr": 0.01}, "log": {"dir": n}}) for n in ("p", "q")]
    assert recipe_labels(logs) == ["p", "q"]
    same = [summary("tiny", {"train": {"lr": 0.01}}, f"tiny-{i}") for i in range(2)]
    assert recipe_labels(same) == ["tiny-0", "tiny-1"]
    assert recipe_labels(same[:1]) == ["tiny"]
    # two runs of one recipe beside a third: the label plus the run's name
    three = [summary(n, {"train": {"lr": v}}) for n, v in (("a", 0.01), ("b", 0.01), ("c", 3))]
    assert recipe_labels(three) == ["train.lr=0.01 (a)", "train.lr=0.01 (b)", "train.lr=3"]
    # more than four keys are counted
    many = [summary(n, {"k": {c: v for c in "abcdef"}}) for n, v in (("a", 1), ("b", 2))]
    assert recipe_labels(many) == ["k.a=1, k.b=1, k.c=1, k.d=1, +2 more",
                                   "k.a=2, k.b=2, k.c=2, k.d=2, +2 more"]  # fmt: skip
    # missing keys, lists, booleans, None, long values
    odd = [
        summary("a", {"k": {"f": 1}, "s": [1, 2], "b": True, "n": None, "t": "x" * 60}),
        summary("b", {"s": [1], "b": False, "n": 0, "t": "y"}),
    ]
    assert recipe_labels(odd) == [
        "k.f=1, s=[1, 2], b=true, n=none, +1 more",
        "k.f=unset, s=[1], b=false, n=0, +1 more",
    ]
    long = [summary("a", {"t": "x" * 60}), summary("b", {"t": "y"})]
    assert recipe_labels(long) == ["t=" + "x" * 39 + "…", "t=y"]


def test_legends_carry_the_labels(specs, summaries) -> None:
    labels = recipe_labels(summaries)
    assert labels == [
        "data.domain=web, train.seed=0, train.lr=0.001 (a)",
        "data.domain=web, train.seed=0, train.lr=0.001 (d)",
        "data.domain=web, train.seed=0, train.lr=0.001 (slow)",
        "data.domain=<img src=x onerror=alert(2)>, train.seed=1, train.lr=unset",
    ]
    for name in [*VALIDATION, *PER_UPDATE]:
        shown = [tr["name"] for tr in specs[name]["data"] if tr.get("showlegend", True)]
        assert shown == [lines(label) for label in labels]
        assert specs[name]["layout"]["showlegend"] is True
    assert lines(labels[3]) == esc("data.domain=<img src=x") + "<br>" + esc(
        "onerror=alert(2)>, train.seed=1,") + "<br>train.lr=unset"  # fmt: skip


# ----------------------------------------------------------------------------- axes, switches


def test_units_on_every_axis_of_every_figure(specs) -> None:
    titles = {name: axis_titles(spec) for name, spec in specs.items()}
    for name, axes in titles.items():
        assert set(axes) == {"xaxis", "yaxis"}, name
        for key, title in axes.items():
            assert has_unit(title), (name, key, title)
    assert titles["val-seconds"] == {
        "xaxis": "wall time (s)",
        "yaxis": "validation val_loss (nat/token)",
    }
    assert titles["val-tokens"]["xaxis"] == "tokens"
    assert titles["val-updates"]["xaxis"] == "optimizer updates"
    assert titles["train-loss"] == {
        "xaxis": "optimizer updates",
        "yaxis": "training loss (nat/token)",
    }
    assert titles["lr"]["yaxis"] == "learning rate"
    assert titles["grad-norm"]["yaxis"] == "grad norm (L2)"
    assert titles["throughput"]["yaxis"] == "throughput (tokens/s)"
    assert titles["phases"]["xaxis"].startswith("wall time (s)")


def test_log_y_switch_on_the_loss_panels(specs) -> None:
    for name, spec in specs.items():
        menus = spec["layout"].get("updatemenus", [])
        if name in (*VALIDATION, "train-loss", "lr", "grad-norm"):
            (menu,) = menus
            assert [b["label"] for b in menu["buttons"]] == ["linear y", "log y"]
            assert [b["args"] for b in menu["buttons"]] == [
                [{"yaxis.type": "linear", "yaxis.nticks": 0}],
                [{"yaxis.type": "log", "yaxis.nticks": LOG_TICKS}],
            ]
        else:
            assert menus == [], name


def test_figures_are_responsive(specs) -> None:
    for spec in specs.values():
        assert spec["config"]["responsive"] is True
        assert spec["layout"]["autosize"] is True
        assert "width" not in spec["layout"]


def test_no_external_resource(page: str) -> None:
    assert 'src="http' not in page and "src='http" not in page
    own = without_plotlyjs(page)
    links = [
        link
        for tag in re.findall(r"<[a-zA-Z][^<>]*>", own)  # the page's own elements
        for link in re.findall(r"""\s(?:src|href)\s*=\s*["']?([^"'\s>]*)""", tag)
    ]
    assert links == ["data:,"]  # the empty favicon, so the browser asks for none
    for resource in ("url(", "@import", "cdn."):
        assert resource not in own, resource


# ----------------------------------------------------------------------------- phases, tables


def test_phase_bars(specs, summaries) -> None:
    spec = specs["phases"]
    bars = traces(spec, "phase")
    assert [b["name"] for b in bars] == ["prep", "train", "eval", "checkpoint"]
    for b in bars:
        assert b["y"] == [esc(i) for i in ids_of(summaries)] and b["orientation"] == "h"
    d_kinds = [b["name"] for b in bars if b["x"][1] > 0]
    assert d_kinds == ["prep", "train", "eval", "checkpoint"]
    widths = {b["name"]: b["x"][1] for b in bars}
    assert widths["train"] / widths["prep"] == pytest.approx(1800 / 300)
    assert spec["layout"]["barmode"] == "stack"
    (ttt,) = traces(spec, "ttt")
    assert ttt["y"] == [esc(ids_of(summaries)[i]) for i in (0, 1, 3)]
    assert ttt["x"] == [s["time_to_target"]["seconds"] for i, s in enumerate(summaries)
                        if i != 2]  # fmt: skip
    # "slow" missed its target: a cross at the end of its bar, named in the legend
    (missed,) = traces(spec, "missed")
    assert missed["name"] == "target not reached"
    assert missed["y"] == [esc(ids_of(summaries)[2])]
    assert missed["x"] == [pytest.approx(sum(summaries[2]["phase_totals"].values()))]
    assert "annotations" not in spec["layout"]


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
    page = render_report([broken])
    (series,) = traces(figures(page)["val-tokens"], "series")
    assert series["y"][1] is None and series["x"][1] is None  # a gap, not a value
    assert len([y for y in series["y"] if y is not None]) == 3
    assert series["connectgaps"] is False
    assert_finite(figures(page))  # a gap is null, never NaN
    assert series["name"] == esc(summaries[0]["run"]["name"])  # one run: its name


def test_cli_writes_the_report(ledger_ws, tmp_path: Path) -> None:
    ws, ids = ledger_ws
    out = tmp_path / "sub" / "report.html"
    proc = ledgerlm("report", ids[0], ids[1], "-o", str(out), "-w", str(ws))  # raises on failure
    assert f"wrote {out} (2 run(s))" in proc.stdout
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert ids[0] in text and ids[1] in text and ids[2] not in text
    assert list(figures(text))[:3] == VALIDATION


# -- in a real browser --------------------------------------------------------------------


def test_report_renders_in_headless_chromium(page: str, specs, summaries, tmp_path) -> None:
    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    labels = recipe_labels(summaries)
    driver = headless_chromium()
    try:
        driver.get(path.as_uri())
        drawn = drawn_figures(driver, len(specs))
        assert [d["name"] for d in drawn] == list(specs)
        for d, spec in zip(drawn, specs.values(), strict=True):
            assert d["w"] > 300 and d["h"] > 150 and d["svgs"] >= 1, d["name"]
            assert d["drawn"] == d["traces"] == len(spec["data"]) > 0, d["name"]
            titles = axis_titles(spec)
            assert d["xtitle"] == [html.unescape(titles["xaxis"])], d["name"]
            assert d["ytitle"] == [html.unescape(titles["yaxis"])], d["name"]
        by_name = {d["name"]: d for d in drawn}
        for name in VALIDATION:
            # markup shown as text (a long label on several lines)
            assert [squash(x) for x in by_name[name]["legend"][:-1]] == list(map(squash, labels))
            markers = [s["points"] for s in by_name[name]["scatter"] if s["role"] == "series"]
            assert markers == [len(s["evaluations"]) for s in summaries]
            assert by_name[name]["buttons"] == ["linear y", "log y"]
        for name in PER_UPDATE:
            assert by_name[name]["lines"] >= len(summaries), name
        # The run id is in the hover text, as text.
        evil = next(
            k
            for k, tr in enumerate(specs["val-tokens"]["data"])
            if tr["meta"]["role"] == "series"
            and tr["meta"]["run"] == esc(summaries[3]["run"]["id"])
        )
        hover = driver.execute_script(
            "const gd = document.getElementById('figure-val-tokens');"
            "Plotly.Fx.hover(gd, [{curveNumber: arguments[0], pointNumber: 0}]);"
            "return gd.querySelector('.hoverlayer').textContent;",
            evil,
        )
        assert summaries[3]["run"]["id"] in hover and "step 500" in hover
        # The log-y switch switches.
        driver.execute_script(
            "const gd = document.getElementById('figure-train-loss');"
            "const b = Array.from(gd.querySelectorAll('.updatemenu-button'))"
            "  .find(x => x.textContent === 'log y');"
            "b.dispatchEvent(new MouseEvent('click', {bubbles: true}));"
        )
        axis_type = "return document.getElementById('figure-train-loss')._fullLayout.yaxis.type"
        assert wait_for(lambda: driver.execute_script(axis_type) == "log")
        # The script-named run is text on the page, not code: no alert, no image.
        assert alerts(driver) == []
        assert driver.execute_script("return document.images.length") == 0
        assert driver.execute_script("return document.scripts.length") == 2 + len(specs)
        assert EVIL in driver.find_element("tag name", "body").text
        # Responsive: the figures follow a narrower window, and the page never scrolls
        # sideways.
        width = (
            "const svg = document.querySelector('#figure-val-seconds .main-svg');"
            "return [svg.getBoundingClientRect().width, document.documentElement.clientWidth];"
        )
        wide, _ = driver.execute_script(width)
        driver.set_window_size(700, 1000)
        assert wait_for(lambda: driver.execute_script(width)[0] < wide - 300), (
            wide,
            driver.execute_script(width),
        )
        narrow, client = driver.execute_script(width)
        assert narrow <= client
        assert driver.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
        assert console_errors(driver) == []
        # The check can fail: an error on the console is seen by the same log.
        driver.execute_script("console.error('probe')")
        assert any("probe" in e["message"] for e in driver.get_log("browser"))
    finally:
        driver.quit()


@pytest.mark.parametrize("width", [400, 1400])
def test_nothing_overlaps_or_is_cut(page: str, specs, summaries, tmp_path, width: int) -> None:
    """Four runs with long legend labels and run ids (one a script): at a 400 px window
    as at 1,400, no legend entry, button, toolbar, axis title or tick label overlaps
    another or leaves its figure."""
    drawn = drawn_cleanly(page, specs, tmp_path, width)
    # every entry is drawn: the run labels, the target line, the phases and marks
    legend = {d["name"]: d["legend"] for d in drawn}
    assert len(legend["val-tokens"]) == len(summaries) + 1
    assert legend["phases"][-2:] == ["time to target", "target not reached"]


def test_a_sweep_keeps_every_legend_entry(tmp_path) -> None:
    """Twelve runs, each labelled by three recipe keys: at 400 px the legends are taller
    than half their figures, and still none scrolls an entry out of sight."""
    with Ledger(tmp_path / "ledger.db") as led:
        recipes = [
            {"train": {"lr": 10 ** (-4 + i / 4), "seed": i}, "model": {"d_model": 64 * (1 + i % 3)}}
            for i in range(12)
        ]
        ids = [
            seed_run(led, f"sweep-{i}", r, steps=1000, sec_per_step=1.0, cross_step=800 + 50 * i)
            for i, r in enumerate(recipes)
        ]
        sweep = render_report([led.run_summary(r) for r in ids])
    drawn = drawn_cleanly(sweep, figures(sweep), tmp_path, 400)
    assert [len(d["legend"]) for d in drawn][:3] == [12 + 1] * 3  # and the target


def squash(text: str) -> str:
    """``text`` without its whitespace: a wrapped label reads back without the spaces it
    was broken at."""
    return "".join(text.split())


def test_device_hours_beside_wall_time(page: str, tmp_path) -> None:
    assert "(resources not recorded: 1 device)" in page  # runs recorded before resources
    assert "<th>device-hours</th>" in page
    with Ledger(tmp_path / "ledger.db") as led:
        base = {"train": {"seed": 0}}
        a = seed_run(led, "a", base, steps=2000, sec_per_step=1.0, cross_step=2000)
        b = seed_run(led, "b", {"train": {"seed": 0, "compile": True}}, steps=2000,
                     sec_per_step=0.6, cross_step=2000)  # fmt: skip
        price = {"currency_per_device_hour": 3.6, "key": "cpu"}
        for run, ranks in ((a, 1), (b, 2)):
            message = held("cpu", "x86_64", ranks, price=price)
            led.add_event(run, RESOURCES, json.dumps(message))
        text = render_report([led.run_summary(r) for r in (a, b)])
    # 1280 s on 2 devices: 2560 device-seconds against 2080 on one
    assert "<td>0.578</td>" in text and "<td>0.711</td>" in text
    assert "0.711 device-hours to target on 2 x cpu (x86_64), cost 2.56 at 3.6/device-hour" in text
    assert "38% sooner in wall time but costs 23% more device time" in text
