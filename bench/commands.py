"""``ledgerlm`` as the benchmark scripts run it: a whole command in a fresh process
(``python -m ledgerlm ...``), the way a user waits for it, timed from outside, with
progress lines off so that printing them costs nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ledgerlm(args: list[str], workspace: Path) -> float:
    """Run ``ledgerlm ARGS -w WORKSPACE`` as a fresh process; its wall seconds."""
    cmd = [sys.executable, "-m", "ledgerlm", *args, "-w", str(workspace)]
    env = {**os.environ, "LEDGERLM_PROGRESS_SECONDS": "0"}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall


def sets(values: list[str]) -> list[str]:
    """Recipe overrides as ``--set VALUE`` arguments."""
    return [arg for value in values for arg in ("--set", value)]
