"""A study, then a run of its best trial with the study on its bill: a 2-trial grid
study on the tiny recipe (``ledgerlm tune``), then ``ledgerlm run RECIPE --from-tune STUDY``
trains the best trial's recipe with a ``search`` phase holding the study's wall and
device time, which its time-to-target includes; another recipe is refused in one line."""

from __future__ import annotations

import shutil

import pytest

from ledgerlm.lab.tune.record import load_study
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

from .conftest import TINY, ledgerlm

pytest.importorskip("optuna")

# Trials of a few seconds; target 5.3 nat/token: lr 3e-3 reaches it within 40 updates,
# 1e-5 never (tests/lab/tune/test_tune_study.py)
SETS = ["train.max_steps=40", "eval.every_steps=10", "train.threads=1", "eval.target_loss=5.3"]
GRID = "train.lr=choice:3e-3,1e-5"


def _ids(ws) -> set[str]:
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        return {r["id"] for r in ledger.list_runs()}


@pytest.mark.slow
def test_a_run_from_a_study_trains_its_best_trial_with_the_study_on_its_bill(tiny_run, tmp_path):
    ws = tmp_path / "ws"
    for kind in ("data", "tokens"):  # the tiny run's versions: the trials prepare nothing
        shutil.copytree(tiny_run.ws / kind, ws / kind)
    sets = [arg for s in SETS for arg in ("--set", s)]
    ledgerlm("tune", str(TINY), "-w", str(ws), "--param", GRID, "--trials", "2", "--sampler",
             "grid", "--pruner", "none", *sets)  # fmt: skip
    study = load_study(Workspace(ws), "latest")
    assert study["complete"] and study["best"]["overrides"] == ["train.lr=0.003"]
    trials = _ids(ws)
    assert len(trials) == 2
    sid = study["study"]

    proc = ledgerlm("run", str(TINY), "-w", str(ws), "--from-tune", sid[:-2], *sets)
    (run,) = _ids(ws) - trials
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        s = ledger.run_summary(run)
    recipe = s["run"]["recipe"]
    assert recipe["train"]["lr"] == 0.003 and recipe["train"]["from_tune"] == sid
    assert recipe["name"] == "tiny"
    (search,) = [p for p in s["phases"] if p["kind"] == "search"]
    assert search["seconds"] == pytest.approx(study["seconds"])  # the study's wall time
    detail = search["detail"]
    assert detail["kind"] == "tune" and set(detail["trials"]) == trials
    assert detail["device_seconds"] == pytest.approx(study["device_seconds"])
    groups = detail["bill"]["groups"]
    assert groups["reached"]["trials"] == 1 and groups["not reached"]["trials"] == 1
    # time-to-target: wall and device time, the study's included
    ttt = s["time_to_target"]
    assert ttt["reached"] and ttt["by_phase"]["search"] == pytest.approx(study["seconds"])
    assert ttt["seconds"] > study["seconds"]
    assert ttt["device_seconds"] > study["device_seconds"] > 0
    assert s["phase_device_totals"]["search"] == pytest.approx(study["device_seconds"])
    # the run prints the study's table, as ledger show does
    assert f"tune study {sid}: 2 trials" in proc.stdout
    shown = ledgerlm("ledger", "show", run, "-w", str(ws)).stdout
    assert f"tune study {sid}: 2 trials" in shown and "not reached" in shown

    # the study's recipe without its overrides is another recipe: refused in one line
    refused = ledgerlm("run", str(TINY), "-w", str(ws), "--from-tune", sid, check=False)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
    assert "not the study's base recipe: eval.every_steps" in refused.stderr
    assert _ids(ws) == trials | {run}  # nothing was run
