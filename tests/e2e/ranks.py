"""What the end-to-end tests of ``torchrun --nproc-per-node 2 -m ledgerlm`` (gloo on
CPU) share: the command, its overrides, killing it, and reading back what it recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from cli_runner import checkpoint_step
from ledgerlm.ledger.store import Ledger

from .conftest import ledgerlm

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def sets(*extra: str) -> list[str]:
    """``--set`` arguments for ``extra``, one intra-op thread per rank first."""
    return [x for o in ["train.threads=1", *extra] for x in ("--set", o)]


def torchrun(*args: str) -> list[str]:
    """The command line of ``torchrun --nproc-per-node 2 -m ledgerlm ARGS``."""
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    return [*run, "2", "-m", "ledgerlm", *args]


def on_two_ranks(*args: str) -> None:
    """``torchrun --nproc-per-node 2 -m ledgerlm ARGS``, which must succeed."""
    proc = subprocess.run(torchrun(*args), capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]


def show(ws: Path) -> dict:
    """``ledgerlm ledger show latest --json`` (a run whose process died is interrupted)."""
    return json.loads(ledgerlm("ledger", "show", "latest", "-w", str(ws), "--json").stdout)


def steps(ws: Path, run_id: str) -> list[dict]:
    """The run's per-update rows."""
    with Ledger(ws / "ledger.db") as ledger:
        return ledger.steps(run_id)


def killed_after_checkpoint(args: list[str], ws: Path, step: int) -> None:
    """Start ``torchrun ... ARGS`` and kill -9 it and both ranks once a checkpoint of
    ``step`` or later is published; the run must still have been training."""
    proc = subprocess.Popen(
        torchrun(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    deadline = time.monotonic() + 600
    while checkpoint_step(ws) < step and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    # kill -9 torchrun and both ranks (which run in sessions of their own)
    for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
