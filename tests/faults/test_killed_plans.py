"""A sweep or a mixture search killed (SIGKILL) in the middle of a run, then the same
command again: the same id, the finished runs reused as they are (not trained again),
the killed run continued in the same ledger run (resumed from its checkpoint, or
restarted from step 0 when it had none), and no more runs than the plan has. Before
the rerun, ``scale fit`` names the point without a result, and a run cannot use the
search's unfinished result."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import TINY, ledgerlm
from ledgerlm.config import load_recipe
from ledgerlm.lab.mixture import use_search
from ledgerlm.ledger import Ledger
from ledgerlm.workspace import Workspace

# Two points of one size: 10 and 12 updates; the second evaluates (and so writes its
# per-update rows) every 2 updates and checkpoints every 3.
SWEEP = ["--sizes", "5e4", "--tokens", "1e4,1.2e4"]
SETS = ["--set", "train.checkpoint_every=3", "--set", "train.threads=1"]
# Search trials of 12 updates with no checkpoint before the end: a killed trial restarts.
PROXY = [
    *("--proxy", "model.n_layers=1", "--proxy", "train.max_steps=12"),
    *("--proxy", "eval.every_steps=2", "--proxy", "train.threads=1"),
]


def _cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("ledgerlm")), *args]


def _rows(ws: Path, name_end: str) -> int:
    """Per-update rows written so far by the run whose name ends with ``name_end``."""
    try:
        with sqlite3.connect(f"file:{ws / 'ledger.db'}?mode=ro", uri=True, timeout=0.5) as db:
            return db.execute(
                "SELECT COUNT(*) FROM steps JOIN runs ON runs.id = steps.run_id "
                "WHERE runs.name LIKE ?",
                (f"%{name_end}",),
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


def _checkpointed(ws: Path, name_end: str) -> bool:
    runs = ws / "runs"
    return runs.is_dir() and any(
        (d / "checkpoint" / "state.json").is_file() for d in runs.glob(f"*{name_end}-*")
    )


def _kill_when(args: list[str], ws: Path, until, out: Path) -> None:
    with out.open("w") as stdout:
        proc = subprocess.Popen(args, stdout=stdout, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not until() and proc.poll() is None:
            assert time.monotonic() < deadline, "the command never reached the kill point"
            time.sleep(0.005)
        assert proc.poll() is None, f"it ended before it could be killed:\n{out.read_text()}"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL


def _runs(ws: Path) -> dict[str, dict]:
    with Ledger(ws / "ledger.db") as ledger:
        return {r["id"]: ledger.run_summary(r["id"]) for r in ledger.list_runs()}


def _steps(ws: Path, run_id: str) -> list[dict]:
    with Ledger(ws / "ledger.db") as ledger:
        return ledger.steps(run_id)


def _restores(summary: dict) -> list[dict]:
    return [p["detail"] for p in summary["phases"] if p["kind"] == "restore"]


@pytest.mark.slow
def test_a_killed_sweep_continues_where_it_stopped(tmp_path):
    ws = tmp_path / "ws"
    args = _cli("scale", "run", str(TINY), *SWEEP, *SETS, "-w", str(ws))
    second = "-N52.4k-D12.3k"
    _kill_when(
        args,
        ws,
        lambda: _rows(ws, second) >= 4 and _checkpointed(ws, second),
        tmp_path / "first.out",
    )
    first_line = (tmp_path / "first.out").read_text().splitlines()[0]
    sweep_id = first_line.split(":")[0].removeprefix("sweep ")
    assert (ws / "sweeps" / f"{sweep_id}.json").is_file()  # kept before the first point
    before = _runs(ws)
    (first,) = [r for r, s in before.items() if s["run"]["status"] == "not reached"]
    (killed,) = [r for r in before if r != first]
    first_steps = _steps(ws, first)

    # the fit names the point the sweep planned and has no result for
    fit = ledgerlm("scale", "fit", "--sweep", sweep_id, "-w", str(ws), check=False)
    assert fit.returncode == 2 and len(fit.stderr.strip().splitlines()) == 1
    assert (
        f"sweep {sweep_id}: 1 of 2 planned points has no result: N=5.2e4 D=1.2e4 "
        f"(run {killed}: interrupted)"
    ) in fit.stderr

    out = json.loads(ledgerlm(*args[1:], "--json").stdout)
    assert out["sweep_id"] == sweep_id and out["skipped"] == []
    assert [p["run"] for p in out["points"]] == [first, killed]
    after = _runs(ws)
    assert set(after) == {first, killed}  # as many runs as planned points
    assert _steps(ws, first) == first_steps and _restores(after[first]) == []  # reused
    (restore,) = _restores(after[killed])  # resumed once, from its checkpoint
    assert restore["restart"] is False and restore["step"] in (3, 6, 9)
    s = after[killed]
    assert s["run"]["status"] == "not reached"
    assert s["counters"]["optimizer_updates"] == 12 and s["steps_recorded"]["updates"] == 12


@pytest.mark.slow
def test_a_killed_search_continues_with_the_same_id(tmp_path):
    ws = tmp_path / "ws"
    args = _cli("mix", "search", str(TINY), "--trials", "3", *PROXY, "-w", str(ws))
    _kill_when(args, ws, lambda: _rows(ws, "-t01") >= 1, tmp_path / "first.out")
    (path,) = (ws / "mixtures").glob("*.json")
    partial = json.loads(path.read_text())
    search_id = partial["search_id"]
    assert partial["complete"] is False and len(partial["trials"]) == 1  # t00, written
    use = [f"data.mixture.from_search={search_id}"]
    with pytest.raises(ValueError, match=r"has no result yet \(1 of 3 trials done\)"):
        use_search(load_recipe(TINY, use), Workspace(ws))
    before = _runs(ws)
    t00 = partial["trials"][0]["run"]
    (killed,) = [r for r in before if r != t00]
    t00_steps = _steps(ws, t00)

    record = json.loads(ledgerlm(*args[1:], "--json").stdout)
    assert record["search_id"] == search_id and record["complete"] is True
    runs = [t["run"] for t in record["trials"]]
    assert runs[:2] == [t00, killed] and len(runs) == 3
    after = _runs(ws)
    assert set(after) == set(runs)  # as many runs as planned trials
    assert _steps(ws, t00) == t00_steps and _restores(after[t00]) == []  # reused
    (restore,) = _restores(after[killed])  # no checkpoint: restarted in the same run
    assert restore["restart"] is True and restore["step"] == 0
    assert after[killed]["counters"]["optimizer_updates"] == 12
    assert record["seconds"] >= record["trial_seconds"] > 0

    recipe, found = use_search(load_recipe(TINY, use), Workspace(ws))  # the result, usable
    assert found["search_id"] == search_id
    assert recipe.data.mixture.weights == pytest.approx(record["recommended"])


@pytest.mark.slow
def test_a_killed_doremi_proxy_restarts_to_the_uninterrupted_result(tmp_path):
    # its reweighting is in no checkpoint: killed after one, the proxy trains again from
    # step 0 in its ledger run, and the result is the uninterrupted search's, to the bit
    full_ws, ws = tmp_path / "full", tmp_path / "ws"
    saved = ("--proxy", "train.checkpoint_every=3")
    doremi = ("mix", "search", str(TINY), "--method", "doremi", *PROXY, *saved, "--json")
    full = json.loads(ledgerlm(*doremi, "-w", str(full_ws)).stdout)
    args = _cli(*doremi, "-w", str(ws))
    _kill_when(
        args,
        ws,
        lambda: _rows(ws, "-proxy") >= 4 and _checkpointed(ws, "-proxy"),
        tmp_path / "first.out",
    )
    (killed,) = [r for r, s in _runs(ws).items() if s["run"]["name"].endswith("-proxy")]
    record = json.loads(ledgerlm(*args[1:]).stdout)
    assert record["search_id"] == full["search_id"]  # the same settings, the same id
    assert record["proxy_run"]["run"] == killed and len(_runs(ws)) == 2
    (restore,) = _restores(_runs(ws)[killed])
    assert restore["restart"] is True
    assert record["history"] == full["history"] and record["recommended"] == full["recommended"]


# -- what cannot be continued (no training: refused before any work) -----------------


def test_a_name_given_to_another_plan_is_refused(tmp_path):
    from ledgerlm.lab.mix_search.record import start_record
    from ledgerlm.lab.sweep import record_plan, run_sweep
    from ledgerlm.scaling.sweep import SweepError, plan

    base = load_recipe(TINY)
    ws = Workspace(tmp_path)
    record_plan(ws, "mine", base, plan(base, [5e4], [1e4]))
    with pytest.raises(SweepError, match="sweep mine was planned from another recipe or grid"):
        run_sweep(base, plan(base, [5e4], [2e4]), ws, sweep_id="mine")
    start_record(ws, "mixes", {"method": "regmix", "trials": 3})
    with pytest.raises(ValueError, match="search mixes was planned from another recipe"):
        start_record(ws, "mixes", {"method": "regmix", "trials": 4})
    assert not ws.ledger_path.exists()


def test_a_run_of_the_name_that_cannot_be_continued_is_refused(tmp_path):
    import fcntl

    from ledgerlm.lab.resume import PlanConflict, continue_run

    ws = Workspace(tmp_path)
    recipe = load_recipe(TINY, ["name=s-N1k-D1k"])
    other = load_recipe(TINY, ["name=s-N1k-D1k", "train.lr=1e-3"])

    def create(r):
        with Ledger(ws.ledger_path) as ledger:
            return ledger.create_run(
                r.name, r.to_dict(), target_metric="loss", target_value=1.0, eval_every=1
            )

    run = create(other)
    with pytest.raises(PlanConflict, match=f"run {run} is named s-N1k-D1k but trained another"):
        continue_run(recipe, ws)
    run = create(recipe)  # the same recipe, being trained by a live process
    ws.run_dir(run).mkdir(parents=True)
    with (ws.run_dir(run) / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(PlanConflict, match=f"run {run} is being trained by another"):
            continue_run(recipe, ws)
