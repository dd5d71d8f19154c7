"""Running the installed ``ledgerlm`` console script as a user would, from any test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"


def ledgerlm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the venv's console script; with ``check``, a failure raises with its output.

    COLUMNS=200 keeps rich from wrapping tables and long paths in what tests read."""
    exe = Path(sys.executable).with_name("ledgerlm")
    proc = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ledgerlm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc
