"""A rank whose peer dies or hangs under ``torchrun`` ends in one line, in bounded time.

Two real ranks (gloo on CPU) train the tiny recipe; rank 1 is killed (SIGKILL) or
stopped (SIGSTOP) mid-training. Rank 0 then prints one line naming the rank that is gone
(no gloo traceback), marks the run failed with that line as its error event, and exits
within ``train.collective_timeout`` and a margin. torchrun watches its ranks only every
``--monitor-interval`` seconds here (30): rank 0 must find out by itself, as it must when
its peer runs on another machine (torchrun's default 0.1 s would SIGTERM it first: it
then ends as any interrupted run does, ``tests/faults/test_signals.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cli_runner import TINY, ledger_updates, ledgerlm

MARGIN = 60.0  # seconds past the timeout for rank 0 to record the failure and exit (2 cores)


def _torchrun(ws: Path, logs: Path, timeout: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--monitor-interval", "30", "--log-dir", str(logs), "--redirects", "2"]
    cmd += ["-m", "ledgerlm", "run", str(TINY), "-w", str(ws)]
    sets = ["train.max_steps=100000", "train.threads=1", "eval.every_steps=100000"]
    sets += [f"train.collective_timeout={timeout}"]
    cmd += [x for s in sets for x in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def _ranks(launcher: subprocess.Popen) -> dict[int, psutil.Process]:
    found = {}
    for child in psutil.Process(launcher.pid).children():
        rank = child.environ().get("RANK")
        if rank is not None:
            found[int(rank)] = child
    return found


def _gone(proc: psutil.Process) -> bool:
    """Exited (a zombie until torchrun, which looks every 30 s, reaps it)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _lose_rank_1(tmp_path: Path, how: signal.Signals, timeout: int) -> tuple[float, str]:
    """Train on two ranks, send ``how`` to rank 1 after 3 updates; the seconds rank 0
    then took to exit, and what it wrote on stderr."""
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    launcher = _torchrun(ws, logs, timeout)
    try:
        deadline = time.monotonic() + 300
        while ledger_updates(ws) < 3:
            assert launcher.poll() is None, "torchrun ended before training"
            assert time.monotonic() < deadline, "the ranks never trained"
            time.sleep(0.05)
        ranks = _ranks(launcher)
        sent = time.monotonic()
        ranks[1].send_signal(how)
        while not _gone(ranks[0]):
            assert time.monotonic() - sent < timeout + MARGIN, "rank 0 is still waiting"
            time.sleep(0.05)
        took = time.monotonic() - sent
    finally:  # rank 1 (stopped, perhaps) and torchrun need not wait for its next look
        for p in [*psutil.Process(launcher.pid).children(recursive=True)]:
            p.kill()
        launcher.kill()
        launcher.wait(60)
    (stderr,) = logs.glob("*/attempt_0/0/stderr.log")
    return took, stderr.read_text()


def _failed_with(ws: Path, line: str) -> None:
    shown = json.loads(ledgerlm("ledger", "show", "latest", "-w", str(ws), "--json").stdout)
    assert shown["run"]["status"] == "failed"
    errors = [e["message"] for e in shown["events"] if e["kind"] == "error"]
    assert errors == [f"PeerLostError: {line}"]


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: rank 0: "), stderr
    return lines[0].removeprefix("error: ")


@pytest.mark.slow
def test_a_killed_rank_ends_the_other_in_one_line(tmp_path):
    took, stderr = _lose_rank_1(tmp_path, signal.SIGKILL, timeout=10)
    line = _one_line(stderr)
    assert line.startswith("rank 0: rank 1 exited ("), line
    assert took < 10 + MARGIN
    _failed_with(tmp_path / "ws", line)


@pytest.mark.slow
def test_a_stopped_rank_ends_the_other_after_the_collective_timeout(tmp_path):
    took, stderr = _lose_rank_1(tmp_path, signal.SIGSTOP, timeout=5)
    line = _one_line(stderr)
    assert line == (
        "rank 0: rank 1 stopped answering (a collective waited 5 s, train.collective_timeout)"
    )
    assert 5 <= took < 5 + MARGIN
    _failed_with(tmp_path / "ws", line)
