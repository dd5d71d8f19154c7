"""Faults of the ledger itself, through the console script: another process holding it
(an exclusive transaction, as a backup or a notebook can) while a run trains, for a
while and for longer than ``log.ledger_timeout``; an empty ledger beside runs; a damaged
ledger and a folder in its place; readers on a read-only workspace and a full disk."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli_runner import TINY, ledgerlm, without_dac_override
from ledgerlm.ledger.store import Ledger
from ledgerlm.train.checkpoint import STATE

SETS = ["eval.stop_at_target=false", "train.threads=1", "train.checkpoint_every=0"]

# Holds the ledger in an exclusive transaction until argv[4] seconds after the file
# argv[2] exists (or argv[3] seconds pass), printing when it took and released the lock.
LOCKER = """
import pathlib, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN EXCLUSIVE")
print("locked", time.time(), flush=True)
release, until = pathlib.Path(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while not release.exists() and time.monotonic() < until:
    time.sleep(0.02)
time.sleep(float(sys.argv[4]))
conn.execute("COMMIT")
print("released", time.time(), flush=True)
"""


def _cli() -> str:
    return str(Path(sys.executable).with_name("ledgerlm"))


def _one_error_line(proc: subprocess.CompletedProcess, warnings: bool = False) -> str:
    """The one error line on stderr, the last; with ``warnings``, after warning lines."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    before = lines[:-1] if warnings else []
    assert lines and lines[-1].startswith("error: "), proc.stderr
    assert lines[:-1] == before and all(w.startswith("warning: ") for w in before), proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A workspace whose data and token versions are built (a 2-step run)."""
    ws = tmp_path_factory.mktemp("prepared") / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=2")
    return ws


def _copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


class Training:
    """``ledgerlm run`` in the background, its progress lines read as they come."""

    def __init__(self, ws: Path, *sets: str) -> None:
        args = [x for s in (*SETS, *sets) for x in ("--set", s)]
        env = {**os.environ, "LEDGERLM_PROGRESS_SECONDS": "0.2", "COLUMNS": "200"}
        self.proc = subprocess.Popen(
            [_cli(), "run", str(TINY), "-w", str(ws), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.done = 0  # updates the progress lines have shown
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line)
            if found := re.search(r"\] train (\d+)/", line):
                self.done = int(found.group(1))

    def finish(self) -> subprocess.CompletedProcess:
        err = self.proc.stderr.read()
        self.proc.wait(timeout=600)
        self._reader.join(timeout=10)
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, "".join(self.out), err
        )


def _until(check, timeout: float = 300.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _training_run(ws: Path) -> str | None:
    """The id of the run that has written per-update rows (None before)."""
    try:
        with Ledger(ws / "ledger.db", read_only=True) as ledger:
            for run in ledger.list_runs():
                if run["status"] == "running" and ledger.steps(run["id"]):
                    return run["id"]
    except Exception:
        return None
    return None


def _lock(
    ledger: Path, release: Path, seconds: float, after: float = 0.0
) -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(ledger), str(release), str(seconds), str(after)],
        stdout=subprocess.PIPE,
        text=True,
    )
    word, at = proc.stdout.readline().split()
    assert word == "locked"
    return proc, float(at)


@pytest.mark.slow
def test_training_goes_on_while_another_process_holds_the_ledger(prepared, tmp_path):
    ws = _copy(prepared, tmp_path / "ws")
    # as many updates as fit in a minute (no evaluation before the last): on any machine
    # training outlasts the lock, which is held for seconds
    steps = 300
    sets = (f"train.max_steps={steps}", f"eval.every_steps={steps}", "eval.budget_seconds=60")
    run = Training(ws, *sets)
    run_id = _until(lambda: _training_run(ws), what="the first per-update rows")
    release = tmp_path / "release"
    locker, locked_at = _lock(ws / "ledger.db", release, 120)
    # Well past the recorder's 2 s heartbeat, which would have to wait for the lock if
    # rows were written as they come, training still makes updates.
    time.sleep(3.0)
    seen = run.done
    _until(lambda: run.done >= seen + 2 or run.proc.poll() is not None, 60, "updates")
    release.touch()
    _, released_at = locker.stdout.readline().split()
    locker.wait(timeout=10)
    proc = run.finish()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "is locked by another process; training goes on" in proc.stderr
    assert "is free again" in proc.stderr
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        summary = ledger.run_summary(run_id)
        rows = ledger.steps(run_id)
    assert summary["run"]["status"] in ("reached", "not reached")
    (end,) = [e for e in summary["events"] if e["kind"] == "train_end"]
    assert [r["step"] for r in rows] == list(range(1, end["step"] + 1))  # every update, once
    during = [r for r in rows if locked_at + 2.5 < r["at"] < float(released_at)]
    assert len(during) >= 2, "training waited for the ledger"
    assert summary["open_phases"] == 0


@pytest.mark.parametrize(
    "after",
    [0.0, pytest.param(6.0, id="still-held-after-the-checkpoint")],
)
@pytest.mark.slow
def test_a_ledger_held_past_its_timeout_fails_the_run_after_a_checkpoint(prepared, tmp_path, after):
    ws = _copy(prepared, tmp_path / "ws")
    steps, every = 10, 5
    sets = (f"train.max_steps={steps}", f"eval.every_steps={every}", "log.ledger_timeout=2")
    run = Training(ws, *sets)
    run_id = _until(lambda: _training_run(ws), what="the first per-update rows")
    checkpoint = ws / "runs" / run_id / "checkpoint" / STATE
    # held until the run has checkpointed (the first evaluation waits 2 s for it first),
    # and then ``after`` seconds more: longer than the run waits to be marked failed
    locker, _ = _lock(ws / "ledger.db", checkpoint, 60, after)
    locker.wait(timeout=120)
    proc = run.finish()
    line = _one_error_line(proc, warnings=True)  # that training waits for the ledger
    assert f"{ws / 'ledger.db'}: database is locked" in line
    assert "log.ledger_timeout = 2 s" in line and f"ledgerlm resume {run_id}" in line
    state = json.loads(checkpoint.read_text())
    assert 0 < state["step"] < steps
    assert f"checkpointed at step {state['step']}" in line
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        summary = ledger.run_summary(run_id)
    if after:  # nothing could be written: the run is interrupted, its rows in the checkpoint
        assert "nor could the run be marked failed" in line
        assert state["unwritten_steps"]
        listed = json.loads(ledgerlm("ledger", "list", "--json", "-w", str(ws)).stdout)
        assert [r["status"] for r in listed if r["id"] == run_id] == ["interrupted"]
    else:
        assert summary["run"]["status"] == "failed"
        (error,) = [e for e in summary["events"] if e["kind"] == "error"]
        assert "LedgerBusyError" in error["message"]

    # The checkpoint continues the run: every update and every due evaluation, once.
    ledgerlm("resume", run_id, "-w", str(ws))
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        summary = ledger.run_summary(run_id)
        rows = ledger.steps(run_id)
    assert summary["run"]["status"] in ("reached", "not reached")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [e["step"] for e in summary["evaluations"]] == list(range(every, steps + 1, every))


def test_an_empty_ledger_beside_runs_is_refused(prepared, tmp_path):
    ws = _copy(prepared, tmp_path / "ws")
    db = ws / "ledger.db"
    for extra in ws.glob("ledger.db-*"):
        extra.unlink()
    db.write_bytes(b"")
    for args in (["ledger", "list"], ["run", str(TINY), "--set", "train.max_steps=2"]):
        line = _one_error_line(ledgerlm(*args, "-w", str(ws), check=False))
        assert line.startswith(f"error: {db}: empty (0 bytes) although {ws / 'runs'} holds 1 run")
    assert db.stat().st_size == 0  # nothing was written over it
    assert len(list((ws / "runs").iterdir())) == 1


def test_a_damaged_ledger_and_a_folder_in_its_place_name_the_path(prepared, tmp_path):
    ws = _copy(prepared, tmp_path / "ws")
    db = ws / "ledger.db"
    for extra in ws.glob("ledger.db-*"):
        extra.unlink()
    data = bytearray(db.read_bytes())
    page = 4096
    data[page : 6 * page] = b"\xa5" * (5 * page)  # the pages after the schema's
    db.write_bytes(bytes(data))
    for args in (["ledger", "list"], ["ledger", "show"], ["report", "latest"]):
        line = _one_error_line(ledgerlm(*args, "-w", str(ws), check=False))
        assert line == f"error: {db}: database disk image is malformed", line

    folder = tmp_path / "folder"
    (folder / "ledger.db").mkdir(parents=True)
    for args in (["ledger", "list"], ["run", str(TINY), "--set", "train.max_steps=2"]):
        line = _one_error_line(ledgerlm(*args, "-w", str(folder), check=False))
        assert line == f"error: {folder / 'ledger.db'}: is a folder, not a ledger file"


def _readers(ws: Path, report: Path) -> list[list[str]]:
    return [
        ["ledger", "list"],
        ["ledger", "show"],
        ["ledger", "steps", "--csv"],
        ["ledger", "compare", "latest"],
        ["report", "latest", "-o", str(report)],
    ]


def test_readers_work_on_a_read_only_workspace(prepared, tmp_path):
    ws = _copy(prepared, tmp_path / "ro")
    for extra in ws.glob("ledger.db-*"):  # as a writer leaves it: no -wal, no -shm
        extra.unlink()
    out = tmp_path / "out"
    out.mkdir()
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    for p in [ws, *ws.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        for args in _readers(ws, out / "report.html"):
            proc = subprocess.run(
                [*without_dac_override(), _cli(), *args, "-w", str(ws)],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "COLUMNS": "200"},
            )
            assert proc.returncode == 0, (args, proc.stderr)
        assert (out / "report.html").stat().st_size > 0
    finally:
        for p in [ws, *ws.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before


def _full_disk() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write that grows a file fails
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_readers_work_on_a_full_disk(prepared, tmp_path):
    ws = _copy(prepared, tmp_path / "full")
    for extra in ws.glob("ledger.db-*"):
        extra.unlink()
    for args in _readers(ws, tmp_path / "report.html")[:4]:  # the report itself is a file
        proc = subprocess.run(
            [_cli(), *args, "-w", str(ws)],
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=_full_disk,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert proc.returncode == 0, (args, proc.stderr)
        if args[-1] == "list":
            assert "tiny-" in proc.stdout
