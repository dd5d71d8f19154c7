"""A command whose extra is not installed stops in one line naming it, before any work."""

from __future__ import annotations

import sqlite3

from cli_runner import ledgerlm_without
from e2e.conftest import TINY


def _runs(ws) -> int:
    return sqlite3.connect(ws / "ledger.db").execute("SELECT count(*) FROM runs").fetchone()[0]


def _one_line_naming(proc, extra: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert f"pip install 'ledgerlm[{extra}]'" in proc.stderr


def test_export_hf_without_transformers(tiny_workspace, tiny_run_id, tmp_path):
    out = tmp_path / "hf"
    ws = str(tiny_workspace)
    proc = ledgerlm_without(
        ("transformers",), tmp_path, "export", "hf", tiny_run_id, str(out), "-w", ws
    )
    _one_line_naming(proc, "hf")
    assert not out.exists()


def test_executor_ray_without_ray(tiny_workspace_copy, tmp_path):
    """On a copy: were the check to come after the work, the work would land in it."""
    before = _runs(tiny_workspace_copy)
    ws = str(tiny_workspace_copy)
    proc = ledgerlm_without(
        ("ray",), tmp_path, "data", "prepare", str(TINY), "--executor", "ray", "-w", ws
    )
    _one_line_naming(proc, "ray")
    proc = ledgerlm_without(
        ("ray",), tmp_path, "run", str(TINY), "--set", 'data.executor="ray"', "-w", ws
    )
    _one_line_naming(proc, "ray")
    assert _runs(tiny_workspace_copy) == before
    assert not list((tiny_workspace_copy / "data").glob(".building-*"))
