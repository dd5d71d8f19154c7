"""A killed run with a downstream task, scored after the fact (``ledgerlm eval``) and then
resumed: the evaluation after the fact is not the run's (it neither breaks the
confirmation streak nor stands in for the run's own evaluation at its step), its seconds
take none of the run's wall- or device-time budget, and a task file changed since the
run started is refused in one line before the ledger holds anything new."""

from __future__ import annotations

import hashlib
import re
import shutil
import sqlite3

import pytest

from kill_at import KillAt, Killed
from ledgerlm.config import load_recipe
from ledgerlm.lab.evaluate_run import evaluate_run
from ledgerlm.lab.resume import resume_run
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger import events
from ledgerlm.ledger.store import Ledger
from ledgerlm.ledger.target import EVAL_AFTER, in_the_run
from ledgerlm.workspace import Workspace

from .tasks_ranks import tasks_recipe

# Any loss under 7 nat/token holds, from the first evaluation on; two in a row confirm
# the target (steps 4 and 8 uninterrupted), and the run stops there, short of max_steps.
# Its budgets (an hour of wall and of device time) are far more than it takes.
SETTINGS = [
    "train.max_steps=16",
    "eval.every_steps=4",
    "eval.target_loss=7.0",
    "eval.confirm=2",
    "eval.budget_seconds=3600",
    "eval.budget_device_hours=1",
    "train.checkpoint_every=4",
    "train.threads=1",
]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """The run killed at step 6 (checkpointed at step 4, evaluated there), with a
    bits-per-byte task."""
    root = tmp_path_factory.mktemp("tasks-resume")
    recipe = tasks_recipe(root, names=("prose",))
    ws = Workspace(root / "ws")
    with pytest.raises(Killed):
        run_recipe(load_recipe(recipe, SETTINGS), ws, callbacks=[KillAt(6)])
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        run_id = ledger.list_runs()[0]["id"]
    return root, run_id


@pytest.fixture
def ws(killed, tmp_path) -> tuple[Workspace, str]:
    root, run_id = killed
    shutil.copytree(root / "ws", tmp_path / "ws")
    return Workspace(tmp_path / "ws"), run_id


def _own_steps(summary: dict) -> list[int]:
    return [e["step"] for e in in_the_run(summary["phases"], summary["evaluations"])]


def test_an_evaluation_after_the_fact_is_not_replayed_into_the_resumed_run(ws):
    """``ledgerlm eval`` of the killed run's checkpoint writes a tasks-only row at step 4;
    replayed as the run's own, it would break the streak the run's step-4 evaluation
    began, and the run would go on past step 8 (where the ledger confirms it)."""
    ws, run_id = ws
    after = evaluate_run(ws, run_id)
    assert after.step == 4 and "loss" not in after.metrics
    summary = resume_run(ws, run_id).summary
    assert _own_steps(summary) == [4, 8]
    assert summary["run"]["status"] == "reached"
    assert summary["time_to_target"]["step"] == 8
    # the row after the fact is still there, beside the run's own
    assert [e["id"] for e in summary["evaluations"] if e["step"] == 4][-1] == after.evaluation_id


def test_an_evaluation_after_the_fact_takes_none_of_the_budgets(ws):
    """Two hours of ``ledgerlm eval --harness`` on the killed run: the resumed run's
    budgets (an hour each) still hold the time it trained and nothing more."""
    ws, run_id = ws
    with Ledger(ws.ledger_path) as ledger:
        detail = {"snapshot_step": 4, "harness": True, "device_seconds": 7200.0}
        ledger.record_phase(run_id, EVAL_AFTER, 7200.0, step_start=4, step_end=4, detail=detail)
    summary = resume_run(ws, run_id).summary
    assert _own_steps(summary) == [4, 8]
    assert summary["run"]["status"] == "reached"
    assert events.latest(summary, events.TRAIN_END)["message"] == "target confirmed"


def _rows(ws: Workspace) -> tuple[int, ...]:
    db = sqlite3.connect(ws.ledger_path)
    try:
        tables = ("evaluations", "phases", "events", "steps")
        return tuple(db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)
    finally:
        db.close()


def test_a_task_file_changed_since_the_run_started_is_refused_on_resume(ws, killed):
    ws, run_id = ws
    path = killed[0] / "tasks" / "prose.jsonl"
    was = path.read_bytes()
    before = _rows(ws)
    try:
        lines = was.decode().splitlines(keepends=True)
        path.write_text("".join([lines[1], lines[0], *lines[2:]]))  # the same items, reordered
        now = hashlib.sha256(path.read_bytes()).hexdigest()
        then = hashlib.sha256(was).hexdigest()
        line = f"{path}: changed since run {run_id} started (sha256 {then[:12]}... then, "
        line += f"{now[:12]}... now)"
        with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
            resume_run(ws, run_id)
    finally:
        path.write_bytes(was)
    assert _rows(ws) == before
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        assert ledger.run_summary(run_id)["run"]["status"] == "failed"
