import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"


def ledgerlm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the installed console script as a user would."""
    exe = Path(sys.executable).with_name("ledgerlm")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"ledgerlm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory) -> Path:
    """One real end-to-end run of the tiny recipe, shared by the read-only tests."""
    ws = tmp_path_factory.mktemp("ws")
    proc = ledgerlm("run", str(TINY), "--workspace", str(ws))
    (ws / "run.stdout").write_text(proc.stdout)
    return ws
