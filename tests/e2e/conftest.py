import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli_runner import ROOT, TINY, ledgerlm
from ledgerlm.ledger.store import Ledger

# e2e modules import from here
__all__ = ["ROOT", "TINY", "ledgerlm", "tiny_run_id", "tiny_workspace", "tiny_workspace_copy"]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` by its relative path: a digest of a file's
    bytes, ``dir`` for a folder. Writing anything there (a run, a file, a folder) changes it."""

    def digest(p: Path) -> str:
        return "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()

    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*"))}


@dataclass
class TinyRun:
    """The session's tiny run: its workspace, its run id and that workspace's digest as
    the run left it."""

    ws: Path
    run_id: str
    digest: dict[str, str]
    changed_by: str | None = None  # the first test that changed the workspace


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> TinyRun:
    """One real end-to-end run of the tiny recipe, made once: tests read it through
    ``tiny_workspace``, or write to a copy of their own (``tiny_workspace_copy``)."""
    ws = tmp_path_factory.mktemp("ws")
    proc = ledgerlm("run", str(TINY), "--workspace", str(ws))
    (ws / "run.stdout").write_text(proc.stdout)
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        (run,) = ledger.list_runs()
    return TinyRun(ws, run["id"], tree_digest(ws))


@pytest.fixture
def tiny_workspace(tiny_run, request) -> Iterator[Path]:
    """The shared run's workspace, to read only. A test that changes anything in it fails
    at its teardown, and every later test using it fails naming that test: the tests
    that share it cannot depend on each other's order."""
    if tiny_run.changed_by is not None:
        pytest.fail(f"the shared tiny workspace was changed by {tiny_run.changed_by}")
    yield tiny_run.ws
    now = tree_digest(tiny_run.ws)
    if now != tiny_run.digest:
        tiny_run.changed_by = request.node.nodeid
        changed = sorted(
            k for k in now.keys() | tiny_run.digest.keys() if now.get(k) != tiny_run.digest.get(k)
        )
        pytest.fail(
            f"{request.node.nodeid} changed the shared tiny workspace ({', '.join(changed[:5])}):"
            " a test that writes takes tiny_workspace_copy"
        )


@pytest.fixture
def tiny_run_id(tiny_run) -> str:
    """The id of the shared run (in ``tiny_workspace`` and in every copy of it)."""
    return tiny_run.run_id


@pytest.fixture
def tiny_workspace_copy(tiny_run, tmp_path) -> Path:
    """A copy of the shared run's workspace, for a test that writes (a run of its own).
    The run that made it has ended and readers close their connections, so no process
    has the ledger open: its file, copied, is a consistent database; the digest says
    the copy is byte for byte the workspace the run left."""
    ws = tmp_path / "ws"
    shutil.copytree(tiny_run.ws, ws)
    assert tree_digest(ws) == tiny_run.digest
    return ws
