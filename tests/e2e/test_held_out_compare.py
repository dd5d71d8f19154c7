"""``ledger compare`` sets each run's validation figure beside its test figures and
warns when the run chosen on validation is not the best on test; ``ledger show`` lists
the test evaluations. Real tiny runs, read at 80 columns.

Run ``late`` confirms its target (any loss under 7 nat/token) at step 8, its first
evaluation, and builds the data; ``soon`` confirms it at step 4 on the data ``late``
built: the sooner to target, chosen on validation, yet 4 updates behind on test."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from cli_runner import ledgerlm
from ledgerlm.cli.ui import fmt_seconds
from ledgerlm.config import load_recipe
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger import compare
from ledgerlm.ledger.compare import compare_runs
from ledgerlm.report.run.page import render_report
from ledgerlm.workspace import Workspace

from .conftest import TINY
from .test_tables_80 import MODES, ledgerlm_at, readable

COMMON = ["train.max_steps=8", "eval.target_loss=7.0", "data.test_fraction=0.1", "train.threads=1"]


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> tuple[Path, str, str]:
    ws = Workspace(tmp_path_factory.mktemp("held_out") / "ws")
    late = run_recipe(load_recipe(TINY, [*COMMON, "eval.every_steps=8", "name=late"]), ws)
    soon = run_recipe(load_recipe(TINY, [*COMMON, "eval.every_steps=4", "name=soon"]), ws)
    return ws.root, soon.run_id, late.run_id


def test_a_run_tested_on_two_snapshots_shows_both_beside_its_validation(two):
    ws = two[0]
    sets = [*COMMON, "eval.every_steps=4", "eval.stop_at_target=false"]
    went = run_recipe(load_recipe(TINY, sets), Workspace(ws))
    (summary,) = _summaries(ws, went.run_id)
    confirming, final = (
        json.loads(e["message"]) for e in summary["events"] if e["kind"] == "test_evaluation"
    )
    (row,) = compare_runs([summary])["held_out"]["rows"]
    assert row["validation"] == summary["time_to_target"]["evaluation"]["metrics"]["loss"]
    assert row["test_confirming"] == row["test"] == confirming["metrics"]["test/loss"]
    assert row["test_final"] == final["metrics"]["test/loss"] != row["test"]


def _summaries(ws: Path, *ids: str) -> list[dict]:
    return [json.loads(ledgerlm("ledger", "show", i, "-w", str(ws), "--json").stdout) for i in ids]


def _test(summary: dict) -> dict:
    (event,) = [e for e in summary["events"] if e["kind"] == "test_evaluation"]
    return json.loads(event["message"])


def test_compare_sets_validation_beside_test_and_warns_on_the_choice(two):
    ws, soon, late = two
    s_soon, s_late = _summaries(ws, soon, late)
    held = compare_runs([s_soon, s_late])["held_out"]
    assert held["metric"] == "loss" and held["test_metric"] == "test/loss"
    rows = {r["run"]: r for r in held["rows"]}
    for run, s in ((soon, s_soon), (late, s_late)):
        test = _test(s)  # each stopped on its confirming snapshot: one test, that one
        assert test["role"] == "confirming"
        confirming = s["time_to_target"]["evaluation"]
        assert rows[run]["validation"] == confirming["metrics"]["loss"]
        assert (
            rows[run]["test_confirming"] == rows[run]["test_final"] == test["metrics"]["test/loss"]
        )
    assert s_soon["time_to_target"]["seconds"] < s_late["time_to_target"]["seconds"]
    assert rows[late]["test"] < rows[soon]["test"]
    assert held["chosen"] == soon and held["best_on_test"] == late
    assert held["warning"] == (
        f"{soon}, chosen on validation (soonest to target), is not the best on test: "
        f"{late} has test/loss {rows[late]['test']:.4f} against {rows[soon]['test']:.4f}"
    )
    # chosen the other way round, the choice is the best on test: no warning
    assert compare_runs([s_late])["held_out"]["warning"] is None


def test_a_choice_ranked_the_wrong_way_is_caught(two, monkeypatch):
    """Mutation check: a chooser that takes the latest to target picks the run that is
    best on test, and the warning above is not given."""
    ws, soon, late = two
    real = min
    monkeypatch.setattr(compare, "min", max, raising=False)
    held = compare_runs(_summaries(ws, soon, late))["held_out"]
    monkeypatch.setattr(compare, "min", real, raising=False)
    assert held["chosen"] == late and held["warning"] is None


@MODES
def test_compare_and_show_print_the_test_figures_at_80_columns(two, tty):
    ws, soon, late = two
    out = ledgerlm_at("ledger", "compare", soon, late, "-w", str(ws), tty=tty)
    held = compare_runs(_summaries(ws, soon, late))["held_out"]
    values = [soon, late]
    for r in held["rows"]:
        values += [f"{r[k]:.4f}" for k in ("validation", "test_confirming", "test_final")]
    readable(out, values, prose=(f"{soon}, chosen", "rule:", "device time"))
    assert "validation and test (loss)" in out and f"{soon}, chosen on validation" in out
    shown = ledgerlm_at("ledger", "show", late, "-w", str(ws), tty=tty)
    test = _test(_summaries(ws, late)[0])
    line = f"test set, confirming snapshot at step 8: loss {test['metrics']['test/loss']:.4f}"
    readable(
        shown, [line, f"{test['targets']:,}", fmt_seconds(test["seconds"])], prose=("events:",)
    )


def test_the_report_sets_validation_beside_test_and_warns(two):
    ws, soon, late = two
    summaries = _summaries(ws, soon, late)
    page = render_report(summaries)
    held = compare_runs(summaries)["held_out"]
    assert "<h3>Validation and test (loss)</h3>" in page
    assert f"{soon} (chosen on validation)" in page
    for r in held["rows"]:
        assert all(f"<td>{r[k]:.4f}</td>" in page for k in ("validation", "test", "test_final"))
    assert f'<p class="warning">{html.escape(held["warning"])}</p>' in page
