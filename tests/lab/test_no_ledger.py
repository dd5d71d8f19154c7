"""A workspace with no ledger.db is refused the same way wherever a command needs one:
one line naming the path, "no ledger here", and what to run first; nothing is created."""

from __future__ import annotations

import pytest

from ledgerlm.lab.export import load_run_model
from ledgerlm.lab.resume import resume_run
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.model.export import ExportError
from ledgerlm.workspace import Workspace


def _refusals(ws: Workspace):
    yield LedgerError, "run something first", lambda: Ledger(ws.ledger_path, read_only=True)
    yield ExportError, "run something first", lambda: load_run_model(ws, "latest")
    yield LedgerError, "run something first", lambda: resume_run(ws, "latest")
    yield FileNotFoundError, "run a sweep first", lambda: load_points("x", workspace=ws)


def test_each_reader_of_the_ledger_refuses_a_workspace_without_one(tmp_path):
    ws = Workspace(tmp_path / "ws")
    for error, hint, call in _refusals(ws):
        with pytest.raises(error, match=f"^{ws.ledger_path}: no ledger here \\({hint}\\)$"):
            call()
    assert not ws.root.exists()
