"""Running the installed ``ledgerlm`` console script as a user would, from any test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"


def ledgerlm(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the venv's console script; with ``check``, a failure raises with its output.

    COLUMNS=200 keeps rich from wrapping tables and long paths in what tests read."""
    exe = Path(sys.executable).with_name("ledgerlm")
    proc = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"ledgerlm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def without_dac_override() -> list[str]:
    """The prefix that runs a command without root's power to ignore permission bits (a
    read-only folder is writable to root); none for another user."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only folder is writable")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


# What an install without an extra looks like to Python: a finder first on the meta
# path that refuses the package and its modules, as a missing one is refused.
BLOCKER = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in {modules!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
"""


def ledgerlm_without(
    modules: tuple[str, ...], root: Path, *args: str
) -> subprocess.CompletedProcess:
    """The console script in an interpreter that cannot import ``modules`` (a
    ``sitecustomize`` on ``PYTHONPATH``, written under ``root``, installs the finder)."""
    folder = root / "without"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER.format(modules=modules))
    env = {**os.environ, "PYTHONPATH": str(folder), "COLUMNS": "200"}
    exe = Path(sys.executable).with_name("ledgerlm")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600, env=env)


def ledger_updates(ws: Path) -> int:
    """Per-update rows a run in ``ws`` has written so far (0 before the ledger exists), as
    a test watching a running command reads them."""
    import sqlite3

    try:
        with sqlite3.connect(f"file:{ws / 'ledger.db'}?mode=ro", uri=True, timeout=0.5) as db:
            return db.execute("SELECT COUNT(*) FROM steps").fetchone()[0]
    except sqlite3.Error:
        return 0


def checkpoint_step(ws: Path) -> int:
    """The step of the checkpoint a run in ``ws`` has published (-1 before the first)."""
    for state in (ws / "runs").glob("*/checkpoint/state.json"):
        try:
            return json.loads(state.read_text())["step"]
        except (OSError, ValueError, KeyError):
            return -1  # being replaced right now
    return -1
