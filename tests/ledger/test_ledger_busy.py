"""The ledger against another process holding it, and read-only readers: real SQLite
files, a real second process in an exclusive transaction."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger.store import SCHEMA_VERSION, Ledger, LedgerBusyError, LedgerError

# Holds the ledger in an exclusive transaction for argv[2] seconds.
HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def _hold(path: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _run(ledger: Ledger) -> str:
    return ledger.create_run("r", {}, target_metric="loss", target_value=1.0, eval_every=1)


def test_a_write_waits_for_another_process_with_backoff(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        run = _run(ledger)
        waits: list[float] = []
        ledger.on_busy = waits.append
        holder = _hold(ledger.path, 1.5)
        t0 = time.monotonic()
        ledger.add_event(run, "note", "written once the holder lets go")
        assert time.monotonic() - t0 > 1.0
        holder.wait(timeout=10)
        assert [e["message"] for e in ledger.run_summary(run)["events"]] == [
            "written once the holder lets go"
        ]
    gaps = [b - a for a, b in itertools.pairwise(waits)]
    assert len(gaps) >= 2 and gaps[-1] > 2 * gaps[0]  # retried, backing off


def test_a_ledger_held_past_its_patience_is_one_busy_error_naming_the_file(tmp_path):
    with Ledger(tmp_path / "ledger.db", patience=0.5) as ledger:
        run = _run(ledger)
        holder = _hold(ledger.path, 3)
        t0 = time.monotonic()
        with pytest.raises(LedgerBusyError, match=r"ledger\.db: database is locked") as err:
            ledger.add_event(run, "note", "never written")
        assert 0.5 <= time.monotonic() - t0 < 2.0
        assert str(err.value).startswith(f"{ledger.path}: ")
        with ledger.waiting_at_most(0):  # one attempt, no wait
            t0 = time.monotonic()
            with pytest.raises(LedgerBusyError):
                ledger.add_steps(run, [_row(1)])
            assert time.monotonic() - t0 < 0.3
        assert ledger.patience == 0.5
        holder.wait(timeout=10)
        assert ledger.run_summary(run)["events"] == []


def _row(step: int) -> dict[str, float]:
    return {"step": step, "tokens": 10, "targets": 9, "loss": 2.0, "grad_norm": 1.0, "lr": 0.1}


def test_the_recorder_keeps_rows_in_memory_while_the_ledger_is_held(tmp_path):
    notes: list[str] = []
    with Ledger(tmp_path / "ledger.db", patience=30) as ledger:
        run = _run(ledger)
        recorder = LedgerRecorder(ledger, run, flush_every=1, note=notes.append)
        recorder.start("train", 0)
        state = SimpleNamespace(step=0, tokens=0, targets=0, loss=2.0, grad_norm=1.0, lr=0.1)
        trainer = SimpleNamespace(state=state)
        recorder.on_train_start(trainer)
        holder = _hold(ledger.path, 2)
        t0 = time.monotonic()
        for _ in range(5):
            state.step, state.tokens, state.targets = state.step + 1, state.tokens + 10, 9
            recorder.on_step_end(trainer)
        assert time.monotonic() - t0 < 1.0  # no update waited for the ledger
        assert len(recorder.rows) == 5 and ledger.steps(run) == []
        assert any("is locked by another process; training goes on" in n for n in notes)
        holder.wait(timeout=10)
        state.step += 1
        recorder.flush_seconds = 0.0  # the next heartbeat is due
        recorder.on_step_end(trainer)
        assert [r["step"] for r in ledger.steps(run)] == [1, 2, 3, 4, 5, 6]
        assert recorder.rows == []
        assert "free again" in notes[-1] and "6 buffered updates written" in notes[-1]
        phase = ledger.run_summary(run)["phases"][0]
        assert phase["step_end"] == 6 and phase["beat_at"] is not None  # beaten with them
        recorder.stop(6)


def test_a_full_buffer_waits_for_the_ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db", patience=30) as ledger:
        run = _run(ledger)
        recorder = LedgerRecorder(ledger, run, flush_every=1, max_rows=3)
        state = SimpleNamespace(step=0, tokens=0, targets=0, loss=2.0, grad_norm=1.0, lr=0.1)
        trainer = SimpleNamespace(state=state)
        recorder.on_train_start(trainer)
        holder = _hold(ledger.path, 1.5)
        t0 = time.monotonic()
        for _ in range(3):
            state.step += 1
            recorder.on_step_end(trainer)
        assert time.monotonic() - t0 > 1.0  # the third row filled the buffer: it waited
        assert [r["step"] for r in ledger.steps(run)] == [1, 2, 3]
        holder.wait(timeout=10)


def test_a_reader_never_writes(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        run = _run(ledger)
    with Ledger(path, read_only=True) as reader:
        assert reader.list_runs()[0]["id"] == run
        assert reader._conn.execute("PRAGMA query_only").fetchone()[0] == 1
        with pytest.raises(LedgerError, match=f"^{path}: attempt to write a readonly database"):
            reader.add_event(run, "note", "refused")
    with pytest.raises(LedgerError, match="no ledger here"):
        Ledger(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()


def test_a_reader_of_an_older_file_brings_it_up_to_date_once(tmp_path):
    path = tmp_path / "ledger.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
        "INSERT INTO meta VALUES ('schema_version', '1');"
    )
    conn.close()
    with Ledger(path, read_only=True) as reader:
        assert reader.list_runs() == []
    conn = sqlite3.connect(path)
    found = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    conn.close()
    assert found == str(SCHEMA_VERSION)


@pytest.mark.parametrize("reader", [False, True])
def test_a_folder_and_an_empty_file_beside_runs_are_refused(tmp_path, reader):
    folder = tmp_path / "a" / "ledger.db"
    folder.mkdir(parents=True)
    with pytest.raises(LedgerError, match=f"^{folder}: is a folder, not a ledger file$"):
        Ledger(folder, read_only=reader)
    empty = tmp_path / "b" / "ledger.db"
    (tmp_path / "b" / "runs" / "r-1").mkdir(parents=True)
    empty.write_bytes(b"")
    with pytest.raises(LedgerError, match=r"empty \(0 bytes\) although .* holds 1 run"):
        Ledger(empty, read_only=reader)
    assert empty.stat().st_size == 0
    alone = tmp_path / "c" / "ledger.db"  # no runs beside it: a new ledger
    alone.parent.mkdir()
    alone.write_bytes(b"")
    if reader:
        with pytest.raises(LedgerError, match=r"empty \(0 bytes\)"):
            Ledger(alone, read_only=True)
    else:
        with Ledger(alone) as ledger:
            assert ledger.list_runs() == []


FULL = """
import resource, signal, sys
from ledgerlm.ledger.store import Ledger, LedgerError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
with Ledger(sys.argv[1]) as ledger:
    try:
        for _ in range(1000):
            ledger.add_event(sys.argv[2], "note", "x" * 1000)
    except LedgerError as exc:
        print(exc)
"""


def test_a_write_on_a_full_disk_names_the_file(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as ledger:
        run = _run(ledger)
    proc = subprocess.run(
        [sys.executable, "-c", FULL, str(path), run], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == f"{path}: disk I/O error", proc.stdout + proc.stderr


@pytest.mark.parametrize("reader", [False, True])
def test_a_file_that_is_no_database_names_itself(tmp_path, reader):
    path = tmp_path / "ledger.db"
    path.write_bytes(b"not a database, " * 512)
    with pytest.raises(LedgerError, match=f"^{path}: file is not a database$"):
        Ledger(path, read_only=reader)
