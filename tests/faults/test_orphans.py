"""A killed build leaves no process and no build folder behind: kill -9, SIGTERM or SIGHUP
of `data prepare`, or of `run` in its data passes, its tokenization or its training, and
within 10 s no process the command started is left (the fork server, the resource
tracker and the workers die with it), a parent capturing the command's output sees it
end, and the next build resumes the data stage's folder and removes a tokenization's.

The input is many small files, one shard each, so the data stage starts its workers
and each pass takes long enough to be killed in its middle: the kill waits for the first
marker of a pass (``read-3.done``), and the test then checks that the pass had not
finished."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from cli_runner import ledgerlm

FILES = 64
RECIPE = """
name = "orphans"
[data]
val_fraction = 0.1
workers = 2
[[data.sources]]
path = "{inputs}/*.jsonl"
[tokenizer]
vocab_size = 300
[pack]
seq_len = 32
[model]
d_model = 32
n_layers = 1
n_heads = 2
[train]
max_steps = 100000
micro_batch_rows = 4
warmup_steps = 2
threads = 1
[eval]
every_steps = 1000
max_tokens = 512
target_loss = 1.0
stop_at_target = false
"""
MARK = "LEDGERLM_ORPHAN_TEST"  # in the environment of every process the command starts


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for f in range(FILES):
        words = (" ".join(f"w{(f * 31 + i * j) % 400}" for j in range(40)) for i in range(40))
        lines = (
            json.dumps({"text": f"file {f} line {i}: {w}"}) + "\n" for i, w in enumerate(words)
        )
        (inputs / f"in{f:02d}.jsonl").write_text("".join(lines))
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(inputs=inputs))
    return path


def _exe() -> str:
    return str(Path(sys.executable).with_name("ledgerlm"))


def _building(ws: Path) -> list[str]:
    return sorted(p.name for kind in ("data", "tokens") for p in (ws / kind).glob(".building-*"))


def _markers(ws: Path, step: str) -> int:
    return sum(1 for _ in (ws / "data").glob(f".building-*/_work/{step}-*.done"))


def _tokenizing(ws: Path) -> bool:
    return any(p.is_dir() for p in (ws / "tokens").glob(".building-*-*"))


def _training(ws: Path) -> bool:
    try:
        with sqlite3.connect(f"file:{ws / 'ledger.db'}?mode=ro", uri=True, timeout=0.5) as db:
            return db.execute("SELECT COUNT(*) FROM steps").fetchone()[0] > 0
    except sqlite3.Error:
        return False


def _marked(token: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries ``token``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARK) == token and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _kill_when(args: list[str], ws: Path, reached, sig: int, workers: bool) -> None:
    """Start ``ledgerlm *args`` capturing its output and send ``sig`` once ``reached()``
    (and, with ``workers``, once its data workers are up): the parent reading both pipes
    must see them close, and within 10 s nothing the command started may be alive."""
    token = uuid.uuid4().hex
    # The command must get SIGHUP's default disposition even when the tests run under
    # nohup: a signal ignored at start stays ignored (lab/signals.py), by design.
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        proc = subprocess.Popen(
            [_exe(), *args, "-w", str(ws)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, MARK: token, "COLUMNS": "200"},
        )
    finally:
        signal.signal(signal.SIGHUP, hangup)
    deadline = time.monotonic() + 120
    started: list[psutil.Process] = []  # the command and all it started, once workers are up
    while not (reached() and (started or not workers)):  # (a cheap test, right before the kill)
        assert proc.poll() is None, f"ended before the kill point: {proc.communicate()}"
        assert time.monotonic() < deadline, "never reached the kill point"
        if workers and not started and any((ws / "data").glob(".building-*/_work")):
            found = _marked(token)  # (a scan of every process: not before the data stage)
            forked = [p for p in found if _ppid(p) not in (os.getpid(), proc.pid, None)]
            started = found if len(forked) >= 2 else []  # forked by the fork server
        time.sleep(0.01)
    os.kill(proc.pid, sig)
    try:
        proc.communicate(timeout=10)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
    left = time.monotonic() + (0 if hung else 10)
    alive = _marked(token)
    while alive and time.monotonic() < left:
        time.sleep(0.1)
        alive = _marked(token)
    shown = [_cmdline(p) for p in alive]
    for p in alive:  # (so that a failure leaves nothing for the next test)
        p.kill()
    proc.wait(10)
    assert not hung, f"the parent hangs reading the killed command's output: {shown}"
    assert not alive, f"left alive 10 s after the kill: {shown}"
    assert proc.returncode != 0
    if workers:  # the command, the fork server, the resource tracker and two workers
        assert len(started) >= 5, [_cmdline(p) for p in started]


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[-120:]
    except psutil.Error:
        return str(p.pid)


def test_data_prepare_killed_in_each_pass_leaves_nothing_and_resumes(recipe, tmp_path):
    ws = tmp_path / "ws"
    prepare = ["data", "prepare", str(recipe)]
    kills = (("read", signal.SIGKILL), ("clean", signal.SIGTERM), ("write", signal.SIGHUP))
    for step, sig in kills:
        _kill_when(prepare, ws, lambda step=step: _markers(ws, step) >= 3, sig, workers=True)
        assert 3 <= _markers(ws, step) < FILES, f"killed outside the {step} pass"
        assert not list((ws / "data").glob("*/manifest.json"))
    ledgerlm(*prepare, "-w", str(ws))
    assert len(list((ws / "data").glob("*/manifest.json"))) == 1
    assert _building(ws) == []


@pytest.mark.slow
def test_run_killed_in_data_tokens_and_training_leaves_nothing(recipe, tmp_path):
    ws = tmp_path / "ws"
    run = ["run", str(recipe)]
    _kill_when(run, ws, lambda: _markers(ws, "read") >= 3, signal.SIGTERM, workers=True)
    assert _markers(ws, "read") < FILES, "killed after the read pass"
    _kill_when(run, ws, lambda: _tokenizing(ws), signal.SIGHUP, workers=False)
    assert len(list((ws / "data").glob("*/manifest.json"))) == 1  # resumed and published
    assert not list((ws / "tokens").glob("*/manifest.json"))
    _kill_when(run, ws, lambda: _training(ws), signal.SIGKILL, workers=False)
    ledgerlm(*run, "-w", str(ws), "--set", "train.max_steps=3")
    assert len(list((ws / "tokens").glob("*/manifest.json"))) == 1
    assert _building(ws) == []


# -- the parts: the parent-death signal, the watchdog, an interrupted pool, dead folders --


def _sleeper(setup: str, then: str = "pass") -> str:
    """Python that runs ``setup``, touches the file named by its first argument, runs
    ``then`` and sleeps."""
    lines = ["import sys, time", "from pathlib import Path", setup, "Path(sys.argv[1]).touch()"]
    return "\n".join([*lines, then, "time.sleep(60)"])


def _python(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], **kw)


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux parent-death signal")
def test_a_process_that_asks_dies_with_its_parent(tmp_path):
    """What the fork server does at start and each worker first: the kernel kills it when
    its parent ends, however the parent ends (here kill -9, which no handler sees)."""
    reached = tmp_path / "reached"
    child = _sleeper("from ledgerlm.data.executor import die_with_parent; die_with_parent()")
    parent = _python(
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}, sys.argv[1]]); "
        "print(p.pid, flush=True); p.wait()",
        str(reached),
        stdout=subprocess.PIPE,
    )
    pid = int(parent.stdout.readline())
    _wait_for(reached, parent)
    parent.kill()
    parent.wait(10)
    alive = not _gone_within(pid, 5)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the child outlived its parent"


def test_a_worker_ends_when_the_build_that_owns_it_is_gone(tmp_path):
    """The watchdog (wherever there is no parent-death signal): a worker whose owner dies
    exits within a second, although its own parent (here this test) lives on; and what it
    prints never reaches the output its parent reads."""
    owner = _python("import time; time.sleep(60)")
    reached = tmp_path / "reached"
    worker = _python(
        _sleeper(
            f"from ledgerlm.data.executor import _start_worker; _start_worker({owner.pid})",
            then="print('a worker writes this', flush=True)",
        ),
        str(reached),
        stdout=subprocess.PIPE,
    )
    _wait_for(reached, worker)
    owner.kill()
    owner.wait(10)  # reaped: the worker cannot tell a zombie owner from a live one by pid
    try:
        out, _ = worker.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail("the worker outlived the build that owns it")
    assert worker.returncode != 0 and out == b""


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # as a command does with SIGINT (and SIGTERM handled like it)


@pytest.mark.parametrize("when", ["while jobs run", "while the workers start"])
def test_an_interrupted_pool_kills_its_workers_at_once(when):
    """A build interrupted while its workers run long jobs does not wait for them, nor,
    interrupted while the fork server is still starting them, for workers the pool has
    no record of yet: all are killed, and the next pool starts fresh ones."""
    from ledgerlm.data.executor import ShardPool

    old = signal.signal(signal.SIGALRM, _interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), ShardPool(workers=2, max_jobs=4) as pool:
            if when == "while jobs run":
                assert pool.map(abs, [(-1,), (-2,)]) == [1, 2]  # the workers are up
            started = time.monotonic()
            # (the fork server imports the data stage for half a second or more)
            signal.setitimer(signal.ITIMER_REAL, 1.0 if when == "while jobs run" else 0.05)
            pool.map(time.sleep, [(30,)] * 4)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - started < 10
    left = [p for p in psutil.Process().children(recursive=True) if "forkserver" in _cmdline(p)]
    assert left == []
    with ShardPool(workers=2, max_jobs=2) as pool:
        assert pool.map(abs, [(-1,), (-2,)]) == [1, 2]


BUILDER = _sleeper(
    "from ledgerlm.workspace import Workspace\n"
    "resumable = sys.argv[4] == 'resumable'\n"
    "build = Workspace(sys.argv[2]).building('tokens', sys.argv[3], resumable)\n"
    "build.__enter__()"
)


def _builder(tmp_path: Path, ws: Path, version: str, how: str = "private") -> subprocess.Popen:
    reached = tmp_path / f"reached-{version}"
    proc = _python(BUILDER, str(reached), str(ws), version, how)
    _wait_for(reached, proc)
    return proc


def test_the_next_build_removes_the_folders_of_dead_builders_only(tmp_path):
    """A builder killed inside ``Workspace.building`` leaves its private folder and its
    lock; the next build (of any version) removes them. A live builder's folder stays,
    and so does a killed resumable build's, for its version's next build to resume."""
    from ledgerlm.workspace import MANIFEST, Workspace

    ws = tmp_path / "ws"
    tokens = ws / "tokens"
    live = _builder(tmp_path, ws, "live")
    try:
        dead = _builder(tmp_path, ws, "dead")
        resumable = _builder(tmp_path, ws, "res", "resumable")
        for proc in (dead, resumable):
            proc.kill()
            proc.wait(10)
        assert len(list(tokens.glob(".building-dead-*"))) == 1
        with Workspace(ws).building("tokens", "next") as tmp:
            (tmp / MANIFEST).write_text("{}")
        left = sorted(p.name for p in tokens.glob(".building-*"))
        assert [n for n in left if n.startswith(".building-dead")] == []  # folder and lock
        assert ".building-res" in left and ".building-live.lock" in left
        assert len([n for n in left if n.startswith(".building-live-")]) == 1
        assert (tokens / "next" / MANIFEST).is_file()
    finally:
        live.kill()
        live.wait(10)


def test_stopping_the_fork_server_never_waits_forever():
    """A process that still holds the server's "alive" pipe (a worker forked as an
    interrupt lands) keeps the server from seeing it closed: stopping then kills it
    after its patience instead of waiting on it for ever."""
    from multiprocessing import forkserver

    from ledgerlm.data import executor

    forkserver.ensure_running()
    server = executor._fork_server()
    holder = os.fork()  # inherits the alive pipe's write end, and sleeps
    if holder == 0:
        time.sleep(60)
        os._exit(0)
    try:
        start = time.monotonic()
        executor._stop_fork_server(patience=0.5)
        assert time.monotonic() - start < 5
        assert executor._fork_server() is None
        assert not psutil.pid_exists(server) or psutil.Process(server).status() == "zombie"
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
