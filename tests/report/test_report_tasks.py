"""The HTML run report's downstream tasks: a figure of each task metric against tokens
and wall time per run, its 95% interval as error bars, the evaluations written after
the fact apart, the task target's threshold with its direction, names escaped; and the
comparison's task line and seed spread. Runs written through the Ledger API."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from ledgerlm.ledger import Ledger
from ledgerlm.report.run.page import render_report
from ledgerlm.report.run.series import eval_seconds
from report.task_ledger import accuracy, bits, task_run
from report_helpers import (
    axis_titles,
    drawn_cleanly,
    figure_blocks,
    figures,
    has_unit,
    traces,
    without_plotlyjs,
)

EVIL = "<img src=x onerror=alert(1)>"  # a task name in a ledger (a recipe's is a slug)


def _evals(shift: int, loss: float) -> list[dict[str, float]]:
    return [
        {"loss": loss + 0.3 - 0.1 * i}
        | accuracy("arith", "exact_match", 10 + 10 * i + shift, 100)
        | accuracy(EVIL, "acc", 20 + 5 * i, 80)
        | bits("story", 1.9 - 0.1 * i, 0.03, 40)
        for i in range(3)
    ]


@pytest.fixture(scope="module")
def summaries(tmp_path_factory) -> list[dict]:
    path = tmp_path_factory.mktemp("report-tasks") / "ledger.db"
    with Ledger(path) as ledger:
        a = task_run(
            ledger, "a", {"name": "a", "train": {"seed": 0}}, evals=_evals(0, 1.0),
            metric="task/arith/exact_match", threshold=0.25,
            targets={"task/arith/exact_match": 0.25, "task/story/bpb": 1.75},
            after=[(200, accuracy("arith", "exact_match", 33, 100), True)],
        )  # fmt: skip
        b = task_run(ledger, "b", {"name": "b", "train": {"seed": 1}}, evals=_evals(5, 0.9))
        return [ledger.run_summary(r) for r in (a, b)]


@pytest.fixture(scope="module")
def page(summaries) -> str:
    return render_report(summaries)


@pytest.fixture(scope="module")
def specs(page) -> dict:
    return figures(page)


def test_a_figure_per_task_metric_against_tokens_and_wall_time(specs) -> None:
    tasks = [name for name in specs if name.startswith("task-")]
    assert tasks == [f"task-{k}-{x}" for k in range(3) for x in ("tokens", "seconds")]
    titles = [axis_titles(specs[f"task-{k}-tokens"])["yaxis"] for k in range(3)]
    assert titles == [
        "arith exact_match (fraction of items)",
        # a long name cut to fit the axis, which runs the figure's height
        f"{html.escape(EVIL[:15], quote=False)}… acc (fraction of items)",
        "story bits per byte (bit/byte)",
    ]
    for name in tasks:
        assert all(has_unit(title) for title in axis_titles(specs[name]).values()), name


def test_error_bars_are_the_95_percent_interval(specs, summaries) -> None:
    a = summaries[0]
    series = traces(specs["task-0-tokens"], "task")
    assert len(series) == 2  # a line per run
    first = series[0]
    in_loop = [ev for ev in a["evaluations"] if ev["phase_id"] != a["phases"][-1]["id"]]
    m = [ev["metrics"] for ev in in_loop]
    key = "task/arith/exact_match"
    assert first["x"] == [ev["tokens"] for ev in in_loop]
    assert first["y"] == pytest.approx([x[key] for x in m], rel=1e-5)
    bars = first["error_y"]
    assert bars["symmetric"] is False
    assert bars["array"] == pytest.approx([x[f"{key}_high"] - x[key] for x in m], rel=1e-5)
    assert bars["arrayminus"] == pytest.approx([x[key] - x[f"{key}_low"] for x in m], rel=1e-5)
    # the wall-time axis is the ledger's own sum, as the validation curves use
    seconds = traces(specs["task-0-seconds"], "task")[0]
    clock = dict(zip((ev["id"] for ev in a["evaluations"]), eval_seconds(a), strict=True))
    assert seconds["x"] == pytest.approx([clock[ev["id"]] for ev in in_loop])


def test_after_the_fact_evaluations_are_apart_and_off_the_clock(specs) -> None:
    (after,) = traces(specs["task-0-tokens"], "task-after")
    assert after["x"] == [200_000] and after["y"] == pytest.approx([0.33])
    assert after["marker"]["symbol"] == "diamond-open" and after["showlegend"] is False
    assert traces(specs["task-0-seconds"], "task-after") == []


def test_a_task_target_is_a_line_named_with_its_direction(specs) -> None:
    def lines(name: str) -> list[tuple[float, str]]:
        return [(s["y0"], s["name"]) for s in specs[name]["layout"].get("shapes", [])]

    assert lines("task-0-tokens") == [(0.25, "target >= 0.25")]
    assert lines("task-2-seconds") == [(1.75, "target <= 1.75")]
    assert lines("task-1-tokens") == []  # no target on that task


def test_task_names_are_escaped(page, specs) -> None:
    own = without_plotlyjs(page)
    assert EVIL not in own
    assert html.escape(f"{EVIL} acc") in own  # the heading
    for text in figure_blocks(page).values():
        assert not {"<", ">", "&"} & set(text)
    for tr in specs["task-1-tokens"]["data"]:
        assert EVIL not in tr["hovertemplate"]
        assert tr["meta"]["metric"] == html.escape(f"task/{EVIL}/acc", quote=False)


def test_run_list_states_the_task_target_with_its_direction(page, summaries) -> None:
    assert "task/arith/exact_match &gt;= 0.25 accuracy" in page


def test_comparison_holds_the_task_line(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        runs = []
        for name, seed, loss, correct in (("a", 0, 1.2, 45), ("b", 1, 1.1, 41)):
            evals = [{"loss": loss} | accuracy("qa", "acc", correct, 100)]
            recipe = {"name": name, "train": {"seed": seed}}
            runs.append(task_run(ledger, name, recipe, evals=evals))
        out = render_report([ledger.run_summary(r) for r in runs])
    assert "val loss improved (1.1000 vs 1.2000, baseline) but not task/qa/acc 0.41±0.05" in out
    assert "<td>task/qa/acc</td><td>0.4300</td>" in out  # the seed group's mean


def test_no_task_section_without_tasks(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        run = task_run(ledger, "plain", evals=[{"loss": 1.0}])
        out = render_report([ledger.run_summary(run)])
    assert "Downstream tasks" not in out and 'data-figure="task-' not in out


@pytest.mark.parametrize("width", [400, 1400])
def test_task_figures_read_cleanly_in_a_browser(page, specs, tmp_path, width: int) -> None:
    drawn_cleanly(page, specs, tmp_path, width)
