"""A run killed before its first checkpoint is shown as interrupted (not running
forever); `resume` says it can only restart, and `resume --restart` trains it again
from step 0 in the same ledger run, to bitwise the weights of an uninterrupted run.

The slow loop kills a run at random points, checkpoint writes included, and requires
every resume to end at the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cli_runner import TINY, ledger_updates, ledgerlm
from ledgerlm.train.checkpoint import WEIGHTS

STEPS = 30
SETS = [
    f"train.max_steps={STEPS}",
    "eval.every_steps=10",
    "eval.stop_at_target=false",
    "train.threads=1",
]


def _args(ws: Path, *extra: str) -> list[str]:
    sets = [x for o in [*SETS, *extra] for x in ("--set", o)]
    return [str(Path(sys.executable).with_name("ledgerlm")), "run", str(TINY), "-w", str(ws), *sets]


def _weights(ws: Path) -> dict[str, torch.Tensor]:
    (run_dir,) = list((ws / "runs").iterdir())
    return load_file(str(run_dir / "checkpoint" / WEIGHTS))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _kill(proc: subprocess.Popen, until, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not until() and proc.poll() is None:
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, str, dict[str, torch.Tensor]]:
    """The run never killed: its workspace, its run id and its final weights."""
    ws = tmp_path_factory.mktemp("full") / "ws"
    subprocess.run(_args(ws), check=True, capture_output=True, timeout=600)
    (run_dir,) = (ws / "runs").iterdir()
    return ws, run_dir.name, _weights(ws)


@pytest.mark.slow
def test_killed_before_any_checkpoint_is_interrupted_and_restarts(uninterrupted, tmp_path):
    full_ws, full_run, expected = uninterrupted
    ws = tmp_path / "ws"
    proc = subprocess.Popen(_args(ws), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _kill(proc, lambda: ledger_updates(ws) >= 3)

    runs = json.loads(ledgerlm("ledger", "list", "-w", str(ws), "--json").stdout)
    (run,) = runs
    assert run["status"] == "interrupted" and run["last_seen"] >= run["created_at"]
    assert "interrupted (last seen" in ledgerlm("ledger", "list", "-w", str(ws)).stdout
    shown = json.loads(ledgerlm("ledger", "show", run["id"], "-w", str(ws), "--json").stdout)
    assert shown["run"]["status"] == "interrupted"

    refused = ledgerlm("resume", run["id"], "-w", str(ws), check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "before its first checkpoint" in refused.stderr and "--restart" in refused.stderr

    ledgerlm("resume", run["id"], "-w", str(ws), "--restart")
    assert _same(_weights(ws), expected)
    s = json.loads(ledgerlm("ledger", "show", run["id"], "-w", str(ws), "--json").stdout)
    full = json.loads(ledgerlm("ledger", "show", full_run, "-w", str(full_ws), "--json").stdout)
    assert s["run"]["status"] == "not reached"
    assert [e["snapshot"] for e in s["evaluations"]] == [e["snapshot"] for e in full["evaluations"]]
    assert s["counters"] == full["counters"]
    restore = [p for p in s["phases"] if p["kind"] == "restore"]
    assert len(restore) == 1 and restore[0]["detail"]["restart"] is True
    assert s["coverage"]["interrupted_seconds"] > 0
    assert s["coverage"]["uncovered_seconds"] < 0.2


def _in_checkpoint_write(ws: Path) -> bool:
    """A checkpoint is being written right now (its temporary folder exists)."""
    return any((ws / "runs").glob("*/.checkpoint.tmp-*")) if (ws / "runs").is_dir() else False


@pytest.mark.slow
def test_ten_random_kills_all_resume_bitwise(uninterrupted, tmp_path):
    """Kill at 10 random points: after a random number of updates, half of them while a
    checkpoint is being written; resume (or restart, before the first checkpoint) gives
    the uninterrupted run's weights every time."""
    _, _, expected = uninterrupted
    rng = random.Random()
    outcomes = []
    for i in range(10):
        ws = tmp_path / f"ws{i}"
        proc = subprocess.Popen(
            _args(ws, "train.checkpoint_every=2"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        after = rng.randint(0, STEPS - 5)
        inside = i % 2 == 1
        _kill(
            proc,
            lambda ws=ws, a=after, c=inside: (
                ledger_updates(ws) >= a and (not c or _in_checkpoint_write(ws))
            ),
        )
        if not (ws / "ledger.db").exists():
            outcomes.append("before the ledger")  # killed at start-up: a fresh run
            subprocess.run(_args(ws), check=True, capture_output=True, timeout=600)
        else:
            run_id = json.loads(ledgerlm("ledger", "list", "-w", str(ws), "--json").stdout)[0]
            out = ledgerlm("resume", run_id["id"], "-w", str(ws), check=False)
            if out.returncode != 0 and "--restart" in out.stderr:
                ledgerlm("resume", run_id["id"], "-w", str(ws), "--restart")
                outcomes.append("restart")
            else:
                assert out.returncode == 0, out.stderr
                outcomes.append("resume")
        assert _same(_weights(ws), expected), f"kill {i} ({outcomes[-1]}) diverged"
    assert len(outcomes) == 10
