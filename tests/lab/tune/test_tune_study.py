"""A real study on the tiny recipe (trials of 40 updates, an evaluation every 10): the grid
sampler's trials in order, each a ledger run of the base recipe with its overrides and
a status of its own, the value told to Optuna as the objective says (time-to-target,
misses ranked after), the same command again training nothing; a median pruner stopping
a bad trial early as pruned; two local workers giving the sequential study's results."""

from __future__ import annotations

import os

import optuna
import pytest

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.lab.tune import run as tune_run
from ledgerlm.lab.tune import trial as tune_trial
from ledgerlm.lab.tune.record import load_study, trial_name
from ledgerlm.lab.tune.study import plan_study, storage_url
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.events import EARLY_STOP
from ledgerlm.workspace import Workspace

# Trials of ~2 s; target 5.3 nat/token: lr 3e-3 reaches it within 40 updates, 1e-5 never.
SETS = [
    "train.max_steps=40",
    "eval.every_steps=10",
    "train.threads=1",
    "eval.target_loss=5.3",
]
GRID = ["train.lr=choice:3e-3,1e-5", "train.warmup_steps=choice:0,5"]
GOOD, BAD = 3e-3, 1e-5


def _summaries(ws: Workspace) -> dict[str, dict]:
    with Ledger(ws.ledger_path) as ledger:
        return {r["name"]: ledger.run_summary(r["id"]) for r in ledger.list_runs()}


def _grid_study(tmp_path, workers=1, grid=GRID):
    ws = Workspace(tmp_path / "ws")
    base = load_recipe(TINY, SETS)
    spec = plan_study(base, grid, trials=None, sampler="grid", pruner="none")
    seen = []
    record = tune_run.tune(spec, ws, workers=workers, on_trial=seen.append)
    return ws, spec, record, seen


def test_a_grid_study_gives_its_trials_in_order_each_a_ledger_run(tmp_path):
    ws, spec, record, seen = _grid_study(tmp_path)
    trials = record["trials"]
    assert record["complete"] and [t["number"] for t in trials] == [0, 1, 2, 3]
    assert [t["number"] for t in seen] == [0, 1, 2, 3]  # reported as each ended
    points = {(t["params"]["train.lr"], t["params"]["train.warmup_steps"]) for t in trials}
    assert points == {(lr, w) for lr in (GOOD, BAD) for w in (0, 5)}  # the whole grid once
    study = optuna.load_study(study_name=spec.study, storage=_storage(spec, ws))
    assert [t.params for t in study.trials] == [t["params"] for t in trials]  # the grid's order
    runs = _summaries(ws)
    assert set(runs) == {trial_name(spec.study, n) for n in range(4)}
    for t in trials:
        summary = runs[t["name"]]
        stored = summary["run"]["recipe"]["train"]
        assert (stored["lr"], stored["warmup_steps"]) == (
            t["params"]["train.lr"],
            t["params"]["train.warmup_steps"],
        )
        assert t["run"] == summary["run"]["id"] and t["attempt"] == 1
        want = "reached" if t["params"]["train.lr"] == GOOD else "not reached"
        assert t["status"] == summary["run"]["status"] == want
        last = summary["evaluations"][-1]["metrics"]["loss"]
        if want == "reached":  # device time to target (wall x 1 before it is recorded)
            found = summary["time_to_target"]
            assert t["value"] == found.get("device_seconds", found["seconds"])
        else:
            assert t["value"] == tune_trial.MISSED + last
        assert study.trials[t["number"]].value == t["value"]
        assert study.trials[t["number"]].state == optuna.trial.TrialState.COMPLETE
    reached = [t for t in trials if t["status"] == "reached"]
    assert max(t["value"] for t in reached) < min(t["value"] for t in trials if t not in reached)
    assert record["best"]["number"] == min(reached, key=lambda t: t["value"])["number"]
    device = sum(tune_trial.device_seconds(runs[t["name"]]) for t in trials)
    assert record["device_seconds"] == pytest.approx(device)
    assert record["seconds"] > 0
    assert load_study(ws, spec.study) == record

    again = tune_run.tune(spec, ws)  # the same study again: nothing trains
    assert _summaries(ws).keys() == runs.keys()
    assert [t["run"] for t in again["trials"]] == [t["run"] for t in trials]
    assert again["seconds"] > record["seconds"]  # this command's time is added


def _storage(spec, ws):
    from ledgerlm.lab.tune.study import open_storage

    return open_storage(storage_url(spec, ws))


def test_the_metric_objective_is_the_last_evaluation(tmp_path):
    ws = Workspace(tmp_path / "ws")
    base = load_recipe(TINY, SETS)
    spec = plan_study(
        base, ["train.lr=choice:1e-5"], sampler="grid", pruner="none", objective="metric"
    )
    record = tune_run.tune(spec, ws)
    (row,) = record["trials"]
    summary = _summaries(ws)[row["name"]]
    assert row["value"] == summary["evaluations"][-1]["metrics"]["loss"] == row["metric"]
    assert summary["evaluations"][-1]["step"] == 40


def test_a_median_pruner_stops_a_bad_trial_early_as_pruned(tmp_path):
    ws = Workspace(tmp_path / "ws")
    base = load_recipe(TINY, SETS)
    pruner = {"kind": "median", "startup_trials": 1, "warmup_steps": 10}
    # seed 1 puts the good learning rate first: the bad one is then measured against it
    spec = plan_study(base, ["train.lr=choice:3e-3,1e-5"], sampler="grid", pruner=pruner, seed=1)
    record = tune_run.tune(spec, ws)
    good, bad = record["trials"]
    assert (good["params"], bad["params"]) == ({"train.lr": GOOD}, {"train.lr": BAD})
    assert good["status"] == "reached"
    assert bad["status"] == "pruned" and bad["value"] is None
    summary = _summaries(ws)[bad["name"]]
    assert summary["run"]["status"] == "pruned"
    assert summary["evaluations"][-1]["step"] == 10  # stopped at its first evaluation
    (event,) = [e for e in summary["events"] if e["kind"] == EARLY_STOP]
    assert "pruned by median at step 10" in event["message"]
    study = optuna.load_study(study_name=spec.study, storage=_storage(spec, ws))
    assert study.trials[1].state == optuna.trial.TrialState.PRUNED
    assert study.trials[1].intermediate_values == {10: pytest.approx(bad["metric"])}
    assert record["best"]["number"] == good["number"]


@pytest.mark.slow
def test_two_local_workers_give_the_sequential_results(tmp_path):
    # trials of 40 and 10 updates: the second trial (10) ends before the first (40)
    grid = ["train.lr=choice:3e-3,1e-5", "train.max_steps=choice:40,10"]
    _, _, one, _ = _grid_study(tmp_path / "one", grid=grid)
    ws, spec, two, _ = _grid_study(tmp_path / "two", workers=2, grid=grid)

    def results(record):
        return {
            tuple(sorted(t["params"].items())): (t["status"], t["metric"], t["attempt"])
            for t in record["trials"]
        }

    assert len(two["trials"]) == 4 and two["complete"]
    assert results(two) == results(one)
    pids = {t["pid"] for t in two["trials"]}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes
    study = optuna.load_study(study_name=spec.study, storage=_storage(spec, ws))
    runs = _summaries(ws)
    for t in two["trials"]:  # each result told to its own trial, from its own run
        assert study.trials[t["number"]].value == t["value"]
        assert study.trials[t["number"]].params == t["params"]
        assert (
            runs[t["name"]]["run"]["recipe"]["train"]["max_steps"] == t["params"]["train.max_steps"]
        )


def test_an_rdb_storage_holds_the_study_instead_of_the_journal(tmp_path):
    ws = Workspace(tmp_path / "ws")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    base = load_recipe(TINY, SETS)
    spec = plan_study(
        base,
        ["train.lr=choice:1e-5"],
        sampler="grid",
        pruner="none",
        objective="metric",
        storage=url,
    )
    record = tune_run.tune(spec, ws)
    assert record["complete"] and record["trials"][0]["status"] == "not reached"
    study = optuna.load_study(study_name=spec.study, storage=url)
    assert study.trials[0].value == record["trials"][0]["value"]
    assert not (ws.study_dir(spec.study) / "journal.log").exists()
    assert load_study(ws, spec.study)["study"] == spec.study  # the record stays in the workspace


@pytest.mark.parametrize("url", ["nosuch://x", "sqlite:////no/such/folder/study.db"])
def test_a_storage_optuna_cannot_open_is_one_line_naming_it(url):
    from ledgerlm.lab.tune.study import open_storage

    with pytest.raises(ValueError, match=r"^--storage '") as caught:
        open_storage(url)
    assert url in str(caught.value) and "\n" not in str(caught.value)
