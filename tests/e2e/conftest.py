from pathlib import Path

import pytest

from cli_runner import ROOT, TINY, ledgerlm

__all__ = ["ROOT", "TINY", "ledgerlm", "tiny_workspace"]  # e2e modules import from here


@pytest.fixture(scope="session")
def tiny_workspace(tmp_path_factory) -> Path:
    """One real end-to-end run of the tiny recipe, shared by the read-only tests."""
    ws = tmp_path_factory.mktemp("ws")
    proc = ledgerlm("run", str(TINY), "--workspace", str(ws))
    (ws / "run.stdout").write_text(proc.stdout)
    return ws
