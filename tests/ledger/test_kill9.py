"""kill -9 of a real training process: the ledger file stays sound, everything committed
before the kill stays, and the train segment it left open carries a heartbeat, so
``close_open_phases`` can charge its work up to the last beat."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger import Ledger, time_to_target

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"
OVERRIDES = [
    "train.max_steps=400",
    "eval.every_steps=10",
    "eval.stop_at_target=false",
    "train.checkpoint_every=0",
    "train.threads=1",
]


# -- the heartbeat the ledger recorder writes ------------------------------------------


class _Trainer(SimpleNamespace):
    def update(self, step: int) -> None:
        self.state.step, self.state.tokens, self.state.targets = step, 100 * step, 90 * step
        self.state.loss, self.state.grad_norm, self.state.lr = 3.0, 1.0, 1e-3


def _trainer(ledger: Ledger) -> _Trainer:
    run = ledger.create_run("beat", {}, target_metric="loss", target_value=1.0, eval_every=10)
    state = SimpleNamespace(step=0, tokens=0, targets=0, loss=0.0, grad_norm=0.0, lr=0.0)
    recorder = LedgerRecorder(ledger, run, flush_every=10, flush_seconds=3600)
    return _Trainer(state=state, recorder=recorder)


def _open(ledger: Ledger, run_id: str) -> list[dict]:
    return [p for p in ledger.run_summary(run_id)["phases"] if p["ended_at"] is None]


def test_step_log_beats_each_new_segment_and_then_by_count(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        trainer = _trainer(ledger)
        log = trainer.recorder
        run = log.run_id
        segment = log.start("train", 0)
        log.on_train_start(trainer)
        trainer.update(1)
        log.on_step_end(trainer)  # the first update of a new phase beats at once
        (row,) = _open(ledger, run)
        assert row["id"] == segment.id and row["beat_at"] >= row["started_at"]
        assert row["step_end"] == 1 and [s["step"] for s in ledger.steps(run)] == [1]
        first = row["beat_at"]
        for step in range(2, 11):
            trainer.update(step)
            log.on_step_end(trainer)
        (row,) = _open(ledger, run)  # buffered until the 10th row since the last write
        assert row["step_end"] == 1 and len(ledger.steps(run)) == 1
        trainer.update(11)
        log.on_step_end(trainer)
        (row,) = _open(ledger, run)
        assert row["step_end"] == 11 and row["beat_at"] >= first
        assert len(ledger.steps(run)) == 11

        with log.interrupt("eval", 11):  # an evaluation cuts the segment
            pass
        trainer.update(12)
        log.on_step_end(trainer)
        (row,) = _open(ledger, run)
        assert row["id"] != segment.id and row["kind"] == "train"
        assert (row["step_start"], row["step_end"]) == (11, 12)
        assert row["beat_at"] is not None

        log.flush_seconds = 0.0  # time-based: every update is now overdue
        trainer.update(13)
        log.on_step_end(trainer)
        assert _open(ledger, run)[0]["step_end"] == 13
        log.flush_seconds = 3600.0
        trainer.update(14)
        log.on_step_end(trainer)
        assert _open(ledger, run)[0]["step_end"] == 13  # buffered
        log.on_train_end(trainer)  # the last rows, and a last beat
        assert _open(ledger, run)[0]["step_end"] == 14
        log.stop(14)
        assert _open(ledger, run) == []
        assert [s["step"] for s in ledger.steps(run)] == list(range(1, 15))


# -- the real thing -------------------------------------------------------------------


def _ro(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
    conn.row_factory = sqlite3.Row
    return conn


def _look(path: Path) -> dict | None:
    """What the ledger shows right now, read-only; None while it cannot be read yet."""
    if not path.exists():
        return None
    try:
        conn = _ro(path)
        try:
            evaluations = [
                dict(r)
                for r in conn.execute(
                    "SELECT id, step, snapshot, metrics_json, phase_id FROM evaluations ORDER BY id"
                )
            ]
            open_phases = [
                dict(r) for r in conn.execute("SELECT * FROM phases WHERE ended_at IS NULL")
            ]
        finally:
            conn.close()
    except sqlite3.OperationalError:  # not created yet, or busy: look again
        return None
    return {"evaluations": evaluations, "open": open_phases}


def _ready(seen: dict | None) -> bool:
    """Two evaluations, and the train segment after them open with a heartbeat."""
    if seen is None or len(seen["evaluations"]) < 2 or len(seen["open"]) != 1:
        return False
    (phase,) = seen["open"]
    return phase["kind"] == "train" and (phase["beat_at"] or 0) > phase["started_at"]


def test_kill_9_mid_training_leaves_a_sound_ledger_with_a_heartbeat(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    db = ws / "ledger.db"
    exe = str(Path(sys.executable).with_name("ledgerlm"))
    sets = [x for o in OVERRIDES for x in ("--set", o)]
    proc = subprocess.Popen(
        [exe, "run", str(TINY), "--workspace", str(ws), *sets],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"the run ended first:\n{proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no second evaluation appeared"
            if _ready(_look(db)):
                # Freeze it and look again: what a stopped process shows is exactly what
                # it shows when the kill lands (it may have moved on to an evaluation).
                os.kill(proc.pid, signal.SIGSTOP)
                seen = _look(db)
                if _ready(seen):
                    break
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()

    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()

    with Ledger(db) as ledger:
        (run_id,) = [r["id"] for r in ledger.list_runs()]
        killed = ledger.run_summary(run_id)
        assert killed["run"]["status"] == "running"
        by_id = {e["id"]: e for e in killed["evaluations"]}
        assert sorted(by_id) == [e["id"] for e in seen["evaluations"]]  # none lost, none new
        for before in seen["evaluations"]:
            after = by_id[before["id"]]
            assert (after["step"], after["snapshot"]) == (before["step"], before["snapshot"])
            assert after["metrics"] == json.loads(before["metrics_json"])
            assert after["metrics"]["loss"] > 0 and len(after["snapshot"]) >= 16

        (segment,) = [p for p in killed["phases"] if p["ended_at"] is None]
        assert killed["open_phases"] == 1
        assert segment["id"] == seen["open"][0]["id"] and segment["kind"] == "train"
        assert segment["beat_at"] >= segment["started_at"] and segment["seconds"] is None
        recorded = [s["step"] for s in ledger.steps(run_id)]
        assert segment["step_start"] < segment["step_end"] <= recorded[-1]
        assert recorded == list(range(1, recorded[-1] + 1))

        (closed,) = ledger.close_open_phases(run_id, "resume")
        after = ledger.run_summary(run_id)

    assert closed["id"] == segment["id"] and closed["ended_at"] == segment["beat_at"]
    assert closed["seconds"] > 0
    assert closed["seconds"] == pytest.approx(segment["beat_at"] - segment["started_at"])
    assert closed["detail"]["closed_by"] == "resume" and closed["detail"]["killed"] is True
    assert after["open_phases"] == 0
    assert after["phase_totals"]["train"] == pytest.approx(
        killed["phase_totals"]["train"] + closed["seconds"]
    )
    assert after["total_seconds"] == pytest.approx(killed["total_seconds"] + closed["seconds"])
    # A confirmation bound to the killed segment is billed everything up to its last beat.
    confirm = [{"step": closed["step_end"], "metrics": {"loss": 0.0}, "phase_id": closed["id"]}]
    before_close = time_to_target(killed["phases"], confirm, "loss", 1.0)
    verdict = time_to_target(after["phases"], confirm, "loss", 1.0)
    assert verdict.seconds == pytest.approx(before_close.seconds + closed["seconds"])
    assert verdict.seconds == pytest.approx(after["total_seconds"])
