"""The SQLite ledger: real rows in a real file under tmp_path."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerlm.ledger import Ledger, LedgerError, time_to_target
from ledgerlm.ledger.store import SCHEMA_VERSION
from seed_ledger import THRESHOLD, seed_run


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger(tmp_path / "nested" / "ledger.sqlite") as led:
        yield led


@pytest.mark.parametrize(
    ("steps", "sec_per_step", "cross", "prep", "expected_s", "expected_step"),
    [
        (2000, 1.0, 2000, 0.0, 2080.0, 2000),  # A
        (2000, 0.6, 2000, 0.0, 1280.0, 2000),  # B
        (4000, 0.8, 4000, 0.0, 3360.0, 4000),  # C
        (2000, 0.9, 1200, 300.0, 1710.0, 1500),  # D: crosses at 1200, confirmed at 1500
    ],
    ids=["A", "B", "C", "D"],
)
def test_seed_example(
    ledger: Ledger,
    steps: int,
    sec_per_step: float,
    cross: int,
    prep: float,
    expected_s: float,
    expected_step: int,
) -> None:
    run = seed_run(
        ledger,
        "seed",
        steps=steps,
        sec_per_step=sec_per_step,
        cross_step=cross,
        prep=prep,
        finish="running",
    )
    ttt = ledger.run_summary(run)["time_to_target"]
    assert ttt["reached"] is True
    assert ttt["step"] == expected_step
    assert ttt["seconds"] == pytest.approx(expected_s)
    assert ttt["evaluation"]["snapshot"] == f"step-{expected_step}"


def test_seed_example_d_by_phase(ledger: Ledger) -> None:
    run = seed_run(
        ledger, "d", steps=2000, sec_per_step=0.9, cross_step=1200, prep=300.0, finish="running"
    )
    summary = ledger.run_summary(run)
    assert summary["time_to_target"]["by_phase"] == pytest.approx(
        {"prep": 300.0, "train": 1350.0, "eval": 60.0}
    )
    # The run kept going past the confirmation; that extra time is not part of the bill.
    assert summary["total_seconds"] == pytest.approx(300 + 1800 + 80)


def test_never_met_is_not_reached(ledger: Ledger) -> None:
    run = seed_run(ledger, "slow", steps=1000, sec_per_step=1.0, cross_step=5000, finish="running")
    ttt = ledger.run_summary(run)["time_to_target"]
    assert ttt["reached"] is False
    assert ttt["status"] == "not reached"
    assert ttt["seconds"] is None
    summary = ledger.run_summary(run)
    verdict = time_to_target(summary["phases"], summary["evaluations"], "val_loss", THRESHOLD)
    assert verdict.describe() == "target NOT reached"


def test_nan_metric_never_confirms(ledger: Ledger) -> None:
    run = ledger.create_run("nan", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    pid = ledger.record_phase(run, "eval", 1.0)
    ledger.add_evaluation(
        run,
        step=1,
        tokens=1,
        targets=1,
        updates=1,
        metrics={"val_loss": math.nan},
        snapshot="s1",
        phase_id=pid,
    )
    summary = ledger.run_summary(run)
    assert math.isnan(summary["evaluations"][0]["metrics"]["val_loss"])
    assert summary["time_to_target"]["reached"] is False


def test_phase_context_manager_records_seconds_and_detail(ledger: Ledger) -> None:
    run = ledger.create_run("cm", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with ledger.phase(run, "train", step_start=0, lr=0.1) as ph:
        # The row is already committed and open: a second reader sees it mid-block.
        with Ledger(ledger.path) as other:
            open_row = other.run_summary(run)["phases"][0]
        assert open_row["id"] == ph.id and open_row["ended_at"] is None
        assert open_row["detail"] == {"lr": 0.1}
        sum(range(10_000))
        ph.detail["loss"] = 2.5
        ph.step_end = 10
    row = ledger.run_summary(run)["phases"][0]
    assert row["seconds"] > 0
    assert row["ended_at"] >= row["started_at"]
    assert (row["step_start"], row["step_end"]) == (0, 10)
    assert row["detail"] == {"lr": 0.1, "loss": 2.5}


def test_phase_closes_on_exception_and_reraises(ledger: Ledger) -> None:
    run = ledger.create_run("boom", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with pytest.raises(RuntimeError, match="out of memory"), ledger.phase(run, "train"):
        raise RuntimeError("out of memory")
    row = ledger.run_summary(run)["phases"][0]
    assert row["seconds"] is not None and row["seconds"] >= 0
    assert row["ended_at"] is not None
    assert row["detail"]["error"] == repr(RuntimeError("out of memory"))


def test_run_ids_and_resolve_run(ledger: Ledger) -> None:
    kw = {"target_metric": "val_loss", "target_value": 3.0, "eval_every": 10}
    alpha = ledger.create_run("alpha", {}, **kw)
    beta1 = ledger.create_run("beta", {}, **kw)
    beta2 = ledger.create_run("beta", {}, **kw)
    assert re.fullmatch(r"alpha-\d{8}-\d{6}-[0-9a-f]{4}", alpha)
    assert beta1 != beta2
    assert [r["id"] for r in ledger.list_runs()] == [beta2, beta1, alpha]

    assert ledger.resolve_run(beta1) == beta1
    assert ledger.resolve_run("latest") == beta2
    assert ledger.resolve_run("alp") == alpha
    assert ledger.resolve_run(beta1[-9:]) == beta1  # any unique part: the time and hex
    assert ledger.resolve_run("pha") == alpha
    with pytest.raises(LedgerError, match=r"'beta' matches 2 runs: "):
        ledger.resolve_run("beta")
    with pytest.raises(LedgerError, match=r"'eta' matches 2 runs: "):
        ledger.resolve_run("eta")
    with pytest.raises(LedgerError, match=r"no run matches 'zzz'$"):
        ledger.resolve_run("zzz")
    typo = alpha.replace("alpha", "alhpa")
    with pytest.raises(LedgerError, match=rf"no run matches .{typo}.; did you mean {alpha}, "):
        ledger.resolve_run(typo)


def test_resolve_latest_on_empty_ledger(ledger: Ledger) -> None:
    with pytest.raises(LedgerError):
        ledger.resolve_run("latest")


def test_run_ids_unique_within_one_second(ledger: Ledger) -> None:
    kw = {"target_metric": "val_loss", "target_value": 3.0, "eval_every": 10}
    ids = [ledger.create_run("same", {}, **kw) for _ in range(200)]
    assert len(set(ids)) == len(ids)


def test_second_ledger_sees_rows_and_file_is_sound(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as writer, Ledger(path) as reader:
        run = writer.create_run(
            "wal", {"lr": 1e-3}, target_metric="val_loss", target_value=3.0, eval_every=100
        )
        writer.record_phase(run, "prep", 2.0)
        writer.set_counters(run, {"tokens": 1024, "updates": 3})
        writer.add_event(run, "note", "hello", step=3)
        assert reader.resolve_run("latest") == run
        summary = reader.run_summary(run)
        assert summary["phase_totals"] == {"prep": 2.0}
        assert summary["counters"] == {"tokens": 1024, "updates": 3}
        assert summary["events"][0]["message"] == "hello"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version[0] == str(SCHEMA_VERSION)
    conn.close()


def test_summary_is_json_and_counters_upsert(ledger: Ledger) -> None:
    run = ledger.create_run(
        "sum",
        {"model": {"d": 64}},
        target_metric="val_loss",
        target_value=3.0,
        eval_every=1,
        meta={"host": "cpu"},
    )
    ledger.set_versions(run, data_version="d1")
    ledger.set_versions(run, tokens_version="t1")
    ledger.set_counters(run, {"tokens": 10, "loss_sum": 1.5})
    ledger.set_counters(run, {"tokens": 20})
    summary = json.loads(json.dumps(ledger.run_summary(run), allow_nan=False))
    assert summary["run"]["recipe"] == {"model": {"d": 64}}
    assert summary["run"]["meta"] == {"host": "cpu"}
    assert (summary["run"]["data_version"], summary["run"]["tokens_version"]) == ("d1", "t1")
    assert summary["counters"] == {"loss_sum": 1.5, "tokens": 20}
    assert summary["total_seconds"] == 0
    assert summary["time_to_target"]["status"] == "not reached"


def test_invalid_writes_are_refused(ledger: Ledger) -> None:
    run = ledger.create_run("bad", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    other = ledger.create_run("other", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with pytest.raises(LedgerError, match="status"):
        ledger.finish_run(run, "done")
    ledger.finish_run(run, "not reached")
    assert ledger.list_runs()[1]["status"] == "not reached"
    with pytest.raises(LedgerError):
        ledger.record_phase("nope", "train", 1.0)
    foreign = ledger.record_phase(other, "eval", 1.0)
    with pytest.raises(LedgerError, match="does not belong"):
        ledger.add_evaluation(
            run,
            step=1,
            tokens=1,
            targets=1,
            updates=1,
            metrics={"val_loss": 1.0},
            snapshot="s",
            phase_id=foreign,
        )


def test_killed_process_leaves_completed_rows_and_open_phase(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    script = f"""
import os
from ledgerlm.ledger import Ledger
led = Ledger({str(path)!r})
run = led.create_run("crash", {{}}, target_metric="val_loss", target_value=3.0, eval_every=1)
led.record_phase(run, "prep", 1.5)
with led.phase(run, "train", step_start=0):
    os._exit(9)
"""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert proc.returncode == 9
    with Ledger(path) as led:
        summary = led.run_summary(led.resolve_run("latest"))
    assert [p["kind"] for p in summary["phases"]] == ["prep", "train"]
    assert summary["phases"][1]["ended_at"] is None
    assert summary["total_seconds"] == pytest.approx(1.5)


def test_steps_are_stored_per_update_and_summarized(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        run = ledger.create_run("r", {}, target_metric="loss", target_value=1.0, eval_every=2)
        rows = [
            {
                "step": i,
                "tokens": 100,
                "targets": 90 + i,
                "loss": 3.0 - i / 10,
                "grad_norm": 1.0,
                "lr": 1e-3,
            }
            for i in (1, 2, 3)
        ]
        rows[2].update(seconds=0.25, at=1234.5)  # its wall time and when it ended
        ledger.add_steps(run, rows[:2])
        ledger.add_steps(run, rows[2:])
        assert [r["step"] for r in ledger.steps(run)] == [1, 2, 3]
        assert [(r["seconds"], r["at"]) for r in ledger.steps(run)][1:] == [
            (None, None),
            (0.25, 1234.5),
        ]
        assert ledger.run_summary(run)["steps_recorded"] == {
            "updates": 3,
            "tokens": 300,
            "targets": 276,
        }


# -- schema version 2: phase heartbeats, closing what a killed process left open ------

# The schema as version 1 of this code wrote it (phases without beat_at).
_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE runs (
    id TEXT PRIMARY KEY, name TEXT, created_at REAL, status TEXT, recipe_json TEXT,
    data_version TEXT, tokens_version TEXT, target_metric TEXT, target_value REAL,
    eval_every INTEGER, meta_json TEXT
);
CREATE TABLE phases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id), kind TEXT,
    started_at REAL, ended_at REAL NULL, seconds REAL NULL, step_start INTEGER NULL,
    step_end INTEGER NULL, detail_json TEXT
);
CREATE TABLE evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id),
    phase_id INTEGER REFERENCES phases(id), step INTEGER, tokens INTEGER, targets INTEGER,
    updates INTEGER, snapshot TEXT, metrics_json TEXT, created_at REAL
);
CREATE TABLE counters (
    run_id TEXT REFERENCES runs(id), name TEXT, value REAL, PRIMARY KEY (run_id, name)
);
CREATE TABLE steps (
    run_id TEXT REFERENCES runs(id), step INTEGER, tokens INTEGER, targets INTEGER,
    loss REAL, grad_norm REAL, lr REAL, PRIMARY KEY (run_id, step)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id),
    step INTEGER NULL, kind TEXT, message TEXT, created_at REAL
);
CREATE INDEX phases_run ON phases(run_id, id);
CREATE INDEX evaluations_run ON evaluations(run_id, step, id);
CREATE INDEX events_run ON events(run_id, id);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO runs VALUES ('old-run', 'old', 1000.0, 'running', '{"lr": 0.1}', 'd1', 't1',
    'loss', 3.0, 10, '{}');
INSERT INTO phases(run_id, kind, started_at, ended_at, seconds, step_start, step_end,
    detail_json) VALUES ('old-run', 'prep', 1000.0, 1002.5, 2.5, NULL, NULL, '{}');
INSERT INTO phases(run_id, kind, started_at, ended_at, seconds, step_start, step_end,
    detail_json) VALUES ('old-run', 'eval', 1002.5, 1003.5, 1.0, 10, 10, '{}');
INSERT INTO phases(run_id, kind, started_at, step_start, detail_json)
    VALUES ('old-run', 'train', 1003.5, 10, '{"note": "killed"}');
INSERT INTO evaluations(run_id, phase_id, step, tokens, targets, updates, snapshot,
    metrics_json, created_at) VALUES ('old-run', 2, 10, 640, 600, 10, 'abc',
    '{"loss": 2.5}', 1003.5);
"""


def _old_ledger(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_SCHEMA_V1)
    conn.close()


def _columns(path: Path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def test_a_version_1_file_is_migrated_and_its_rows_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _old_ledger(path)
    assert "beat_at" not in _columns(path, "phases")
    with Ledger(path) as ledger:
        summary = ledger.run_summary("old-run")
        assert [p["kind"] for p in summary["phases"]] == ["prep", "eval", "train"]
        assert [p["beat_at"] for p in summary["phases"]] == [None, None, None]
        assert summary["phases"][2]["detail"] == {"note": "killed"}
        assert summary["phase_totals"] == {"prep": 2.5, "eval": 1.0, "train": 0.0}
        assert summary["open_phases"] == 1
        assert summary["evaluations"][0]["metrics"] == {"loss": 2.5}
        assert summary["evaluations"][0]["consumed"] == {}  # a column added later: empty
        assert summary["time_to_target"]["seconds"] == pytest.approx(3.5)
        # The migrated file takes the new writes.
        ledger.beat(3, step=12)
        (closed,) = ledger.close_open_phases("old-run", "resume")
        assert closed["seconds"] > 0 and closed["step_end"] == 12
    assert _columns(path, "phases")[-1] == "beat_at"
    assert _columns(path, "evaluations")[-1] == "consumed_json"
    assert _columns(path, "steps")[-2:] == ["seconds", "at"]  # each update's time and end
    with Ledger(path) as again:  # a second open changes nothing
        assert again.run_summary("old-run")["open_phases"] == 0
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'")
        assert version.fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        conn.close()


def test_a_file_from_newer_code_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _old_ledger(path)
    conn = sqlite3.connect(path)
    newer = SCHEMA_VERSION + 1
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(newer),))
    conn.commit()
    conn.close()
    match = f"schema_version {newer}, this code reads up to {SCHEMA_VERSION}"
    with pytest.raises(LedgerError, match=match):
        Ledger(path)
    assert "beat_at" not in _columns(path, "phases")  # the refusal rolled back


def _dead_phase(path: Path, run: str, kind: str, started_at: float) -> int:
    """An open phase row as a process killed mid-phase leaves it."""
    conn = sqlite3.connect(path)
    try:
        cur = conn.execute(
            "INSERT INTO phases(run_id, kind, started_at, step_start, detail_json)"
            " VALUES (?, ?, ?, 0, '{\"lr\": 0.1}')",
            (run, kind, started_at),
        )
        conn.commit()
        return int(cur.lastrowid)
    finally:
        conn.close()


def test_beat_and_close_open_phases(ledger: Ledger) -> None:
    run = ledger.create_run("k", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    other = ledger.create_run("o", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    done = ledger.record_phase(run, "prep", 1.5)
    now = time.time()
    train = _dead_phase(ledger.path, run, "train", now - 10.0)
    evaluation = _dead_phase(ledger.path, run, "eval", now - 1.0)  # never beat
    elsewhere = _dead_phase(ledger.path, other, "train", now - 5.0)

    ledger.beat(train, step=3)
    first = ledger.run_summary(run)["phases"][1]["beat_at"]
    ledger.beat(train)  # no step: step_end stays
    ledger.beat(done, step=99)  # an ended phase is left alone
    summary = ledger.run_summary(run)
    beaten = summary["phases"][1]
    assert beaten["beat_at"] >= first >= beaten["started_at"] and beaten["step_end"] == 3
    assert beaten["ended_at"] is None and beaten["seconds"] is None
    assert summary["phases"][0]["beat_at"] is None and summary["phases"][0]["step_end"] is None
    assert summary["open_phases"] == 2 and summary["total_seconds"] == pytest.approx(1.5)

    closed = ledger.close_open_phases(run, "resume")
    assert [p["id"] for p in closed] == [train, evaluation]
    assert closed[0]["ended_at"] == beaten["beat_at"]
    assert closed[0]["seconds"] == pytest.approx(beaten["beat_at"] - beaten["started_at"])
    assert closed[0]["seconds"] == pytest.approx(10.0, abs=1.0)
    assert closed[0]["detail"] == {"lr": 0.1, "closed_by": "resume", "killed": True}
    assert (closed[1]["ended_at"], closed[1]["seconds"]) == (closed[1]["started_at"], 0.0)
    assert closed[1]["detail"]["killed"] is True

    after = ledger.run_summary(run)
    assert after["open_phases"] == 0
    stored = [{k: v for k, v in p.items() if k != "device_seconds"} for p in after["phases"]]
    assert stored[1:] == closed  # what was returned is what is stored (summaries add device time)
    assert after["phase_totals"] == pytest.approx(
        {"prep": 1.5, "train": closed[0]["seconds"], "eval": 0.0}
    )
    # Time-to-target sums now charge the killed segment up to its last heartbeat.
    confirm = [{"step": 3, "metrics": {"val_loss": 1.0}, "phase_id": evaluation}]
    verdict = time_to_target(after["phases"], confirm, "val_loss", THRESHOLD)
    assert verdict.seconds == pytest.approx(1.5 + closed[0]["seconds"])

    assert ledger.close_open_phases(run, "resume") == []  # nothing left open
    ledger.beat(train, step=7)  # a late beat cannot reopen or move a closed phase
    later = ledger.run_summary(run)["phases"]
    assert [{k: v for k, v in p.items() if k != "device_seconds"} for p in later][1:] == closed
    assert ledger.run_summary(other)["open_phases"] == 1  # other runs untouched
    assert ledger.run_summary(other)["phases"][0]["id"] == elsewhere
    with pytest.raises(LedgerError, match="no run"):
        ledger.close_open_phases("nope", "resume")
