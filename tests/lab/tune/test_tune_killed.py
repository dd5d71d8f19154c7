"""``ledgerlm tune`` killed (SIGKILL) in the middle of a trial, then the same command
again: the same study, no finished trial trained again, the interrupted trial resumed
from its checkpoint in the same ledger run, or (with no checkpoint yet) marked failed
and retried once with the same params; then the study completes. And a missing Optuna
is one line naming the extra, before anything is written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import TINY, ledgerlm, ledgerlm_without
from ledgerlm.config import load_recipe
from ledgerlm.lab.tune.record import load_study, trial_name
from ledgerlm.lab.tune.study import plan_study
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.events import RESUME
from ledgerlm.workspace import Workspace

SETS = ["train.max_steps=40", "eval.every_steps=10", "train.threads=1"]
PARAMS = ["train.lr=choice:3e-3,1e-3,1e-5"]
FLAGS = ["--sampler", "grid", "--pruner", "none", "--objective", "metric"]


def _command(ws: Path, sets: list[str]) -> list[str]:
    args = ["tune", str(TINY), "-w", str(ws), *FLAGS]
    for p in PARAMS:
        args += ["--param", p]
    for s in sets:
        args += ["--set", s]
    return [str(Path(sys.executable).with_name("ledgerlm")), *args]


def _runs(ws: Path) -> dict[str, dict]:
    with Ledger(ws / "ledger.db") as ledger:
        return {r["name"]: ledger.run_summary(r["id"]) for r in ledger.list_runs()}


def _steps(summary: dict) -> int:
    return summary["steps_recorded"]["updates"]


def _started(ws: Path, name: str, checkpointed: bool) -> bool:
    """Whether trial ``name``'s run has trained (a checkpoint, or some update rows)."""
    runs = ws / "runs"
    if checkpointed:
        return runs.is_dir() and any(
            (d / "checkpoint" / "state.json").is_file() for d in runs.glob(f"{name}-*")
        )
    import sqlite3

    try:
        with sqlite3.connect(f"file:{ws / 'ledger.db'}?mode=ro", uri=True, timeout=0.5) as db:
            return (
                db.execute(
                    "SELECT COUNT(*) FROM steps JOIN runs ON runs.id = steps.run_id "
                    "WHERE runs.name = ?",
                    (name,),
                ).fetchone()[0]
                > 0
            )
    except sqlite3.Error:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("checkpointed", [True, False], ids=["resumed", "retried"])
def test_a_killed_study_continues_with_the_same_command(tmp_path, checkpointed):
    ws = tmp_path / "ws"
    sets = [*SETS, f"train.checkpoint_every={10 if checkpointed else 0}"]
    spec = plan_study(
        load_recipe(TINY, sets), PARAMS, sampler="grid", pruner="none", objective="metric"
    )
    killed = trial_name(spec.study, 1)
    out = tmp_path / "killed.txt"
    with out.open("w") as stdout:
        proc = subprocess.Popen(_command(ws, sets), stdout=stdout, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not _started(ws, killed, checkpointed) and proc.poll() is None:
            assert time.monotonic() < deadline, "the study never reached its second trial"
            time.sleep(0.005)
        assert proc.poll() is None, f"it ended before it could be killed:\n{out.read_text()}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    before = _runs(ws)
    record = load_study(Workspace(ws), spec.study)
    assert [t["status"] for t in record["trials"]] == ["not reached", "running"]
    first = before[trial_name(spec.study, 0)]

    done = subprocess.run(_command(ws, sets), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    after = _runs(ws)
    record = load_study(Workspace(ws), spec.study)
    assert record["complete"]
    again = after[trial_name(spec.study, 0)]  # the finished trial: not trained again
    assert again["run"]["id"] == first["run"]["id"] and _steps(again) == _steps(first) == 40
    assert not [e for e in again["events"] if e["kind"] == RESUME]
    lrs = sorted(t["params"]["train.lr"] for t in record["trials"] if t["status"] != "failed")
    assert lrs == [1e-5, 1e-3, 3e-3]  # every grid point once, with a result
    interrupted = after[killed]
    if checkpointed:  # resumed in the same ledger run, from its checkpoint
        assert len(record["trials"]) == 3 and len(after) == 3
        assert interrupted["run"]["id"] == before[killed]["run"]["id"]
        resumed = [e for e in interrupted["events"] if e["kind"] == RESUME]
        assert resumed and resumed[0]["message"].startswith("from step ")
        assert interrupted["run"]["status"] == record["trials"][1]["status"] == "not reached"
        assert _steps(interrupted) == 40
    else:  # no checkpoint: failed, and retried once with the same params
        rows = {t["number"]: t for t in record["trials"]}
        assert rows[1]["status"] == "failed" and interrupted["run"]["status"] == "failed"
        (retry,) = [t for t in record["trials"] if t["attempt"] == 2]
        assert retry["params"] == rows[1]["params"] and retry["status"] == "not reached"
        assert len(record["trials"]) == 4 and len(after) == 4
    lines = done.stdout
    assert f"study {spec.study}" in lines and "device-h" in lines
    assert f"--from-tune {spec.study}" in lines


def test_missing_optuna_is_one_line_naming_the_extra(tmp_path):
    ws = tmp_path / "ws"
    args = ["tune", str(TINY), "-w", str(ws), "--param", "train.lr=log:1e-4:1e-2"]
    proc = ledgerlm_without(("optuna",), tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: ledgerlm tune needs the optuna package: pip install 'ledgerlm[tune]'"
    ]
    assert not ws.exists()


def test_a_bad_param_is_one_line_naming_the_flag(tmp_path):
    ws = tmp_path / "ws"
    proc = ledgerlm(
        "tune", str(TINY), "-w", str(ws), "--param", "train.lrr=log:1e-4:1", check=False
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --param 'train.lrr=log:1e-4:1': train.lrr=0.0001: unknown key 'train.lrr'; "
        "did you mean lr?"
    ]
    assert not ws.exists()


@pytest.mark.slow
def test_a_worker_killed_mid_trial_fails_it_and_it_is_retried_once(tmp_path):
    import threading

    import psutil

    from ledgerlm.lab.tune.run import tune

    ws = tmp_path / "ws"
    spec = plan_study(
        load_recipe(TINY, SETS), PARAMS, sampler="grid", pruner="none", objective="metric"
    )
    victim = trial_name(spec.study, 1)
    killed: list[int] = []

    def kill_its_worker() -> None:
        deadline = time.monotonic() + 300
        while not killed and time.monotonic() < deadline:
            if _started(ws, victim, checkpointed=False):
                for child in psutil.Process().children(recursive=True):
                    try:
                        files = [f.path for f in child.open_files()]
                    except psutil.Error:
                        continue
                    if any(f"/{victim}-" in f and f.endswith("/.lock") for f in files):
                        os.kill(child.pid, signal.SIGKILL)
                        killed.append(child.pid)
                        return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_its_worker, daemon=True)
    killer.start()
    record = tune(spec, Workspace(ws), workers=2)
    killer.join(timeout=5)
    assert killed, "the worker running the second trial was never found"
    rows = {t["number"]: t for t in record["trials"]}
    assert rows[1]["status"] == "failed" and rows[1]["error"].startswith("worker lost:")
    retries = [t for t in record["trials"] if t["attempt"] == 2]
    assert rows[1]["params"] in [t["params"] for t in retries]
    assert all(t["status"] != "failed" for t in retries)  # each retried once, and it ended
    lrs = sorted(t["params"]["train.lr"] for t in record["trials"] if t["status"] != "failed")
    assert lrs == [1e-5, 1e-3, 3e-3] and record["complete"]
    assert _runs(ws)[victim]["run"]["status"] == "failed"
