"""SIGTERM (a scheduler's kill, torchrun's) ends a run as Ctrl-C does: one error line, the
exit status a shell gives the signal, an ``interrupted`` event, the run marked failed, no
temporary checkpoint folder left, and ``ledgerlm resume`` continues it.

The handlers themselves (``lab/signals.py``) are checked in this process: each signal
that ends a command raises ``KeyboardInterrupt`` naming it, an ignored one stays
ignored, and a failing run's cleanup is not cut short by a second one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import TINY, ledger_updates, ledgerlm
from ledgerlm.lab.signals import (
    ENDING,
    exit_status,
    received,
    signals_as_interrupts,
    undisturbed,
)

STEPS = 40


def _writing_second_checkpoint(ws: Path) -> bool:
    """A checkpoint is being written (its temporary folder exists) and one is kept."""
    runs = ws / "runs"
    return runs.is_dir() and any(
        (run / "checkpoint" / "state.json").is_file() and any(run.glob(".checkpoint.tmp-*"))
        for run in runs.iterdir()
    )


@pytest.mark.slow
def test_sigterm_during_a_checkpoint_write_ends_the_run_as_ctrl_c_does(tmp_path):
    ws = tmp_path / "ws"
    sets = [f"train.max_steps={STEPS}", "train.checkpoint_every=2", "train.threads=1"]
    sets += ["eval.every_steps=20", "eval.stop_at_target=false"]
    cmd = [str(Path(sys.executable).with_name("ledgerlm")), "run", str(TINY), "-w", str(ws)]
    cmd += [x for s in sets for x in ("--set", s)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (ledger_updates(ws) >= 3 and _writing_second_checkpoint(ws)) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run never wrote a second checkpoint"
        time.sleep(0.001)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)

    assert proc.returncode == 128 + signal.SIGTERM, err
    assert [line for line in err.splitlines() if line.strip()] == ["error: interrupted by SIGTERM"]
    (run_dir,) = (ws / "runs").iterdir()
    assert not list(run_dir.glob(".checkpoint.tmp-*")), "the temporary checkpoint was left"
    shown = json.loads(ledgerlm("ledger", "show", "latest", "-w", str(ws), "--json").stdout)
    assert shown["run"]["status"] == "failed"
    assert shown["open_phases"] == 0
    assert [(e["kind"], e["message"]) for e in shown["events"] if e["kind"] == "interrupted"] == [
        ("interrupted", "SIGTERM")
    ]
    assert not [e for e in shown["events"] if e["kind"] == "error"]
    assert "interrupted: SIGTERM" in ledgerlm("ledger", "show", "latest", "-w", str(ws)).stdout

    ledgerlm("resume", shown["run"]["id"], "-w", str(ws))
    done = json.loads(ledgerlm("ledger", "show", "latest", "-w", str(ws), "--json").stdout)
    assert done["run"]["status"] in ("reached", "not reached")
    assert done["counters"]["optimizer_updates"] == STEPS


@pytest.fixture
def default_handlers():
    """The handlers a fresh command starts with: an earlier test's library (a sink's, a
    process group's) may have left its own in this process."""
    found = {s: signal.getsignal(s) for s in ENDING}
    for s in ENDING:
        signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    yield
    for s, handler in found.items():
        if handler is not None:
            signal.signal(s, handler)


def _send(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.5)  # the handler runs at the next bytecode; the sleep gives it one


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_ending_signal_raises_an_interrupt_naming_it(sig, default_handlers):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt) as caught, signals_as_interrupts():
        _send(sig)
    assert str(caught.value) == sig.name
    assert exit_status(caught.value) == 128 + sig
    assert signal.getsignal(sig) == before  # the handler found is back


def test_a_bare_ctrl_c_is_sigint():
    assert exit_status(KeyboardInterrupt()) == 130


def test_an_ignored_signal_stays_ignored(default_handlers):
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    try:
        with signals_as_interrupts():
            _send(signal.SIGHUP)  # nothing happens
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_signal_during_cleanup_does_not_cut_it_short(default_handlers):
    done, ended = [], None
    try:
        with signals_as_interrupts():
            try:
                raise ValueError("the first error")
            finally:
                with undisturbed():
                    _send(signal.SIGTERM)  # torchrun's, to a rank whose peer just died
                    done.append("recorded")
    except BaseException as exc:  # an interrupt here would be a failure, not pytest's stop
        ended = exc
    assert isinstance(ended, ValueError) and done == ["recorded"]
    assert str(received()) == "SIGTERM"  # what ended the command: the run is interrupted


@pytest.mark.slow
def test_sigterm_to_torchrun_interrupts_every_rank(tmp_path):
    """torchrun passes SIGTERM to its ranks: each prints the line, rank 0 records it."""
    ws, logs = tmp_path / "ws", tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--log-dir", str(logs), "--redirects", "2", "-m", "ledgerlm", "run", str(TINY)]
    cmd += ["-w", str(ws), "--set", "train.max_steps=100000", "--set", "train.threads=1"]
    cmd += ["--set", "eval.every_steps=100000", "--set", "train.checkpoint_every=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 300
    while ledger_updates(ws) < 5:
        assert proc.poll() is None and time.monotonic() < deadline, "the ranks never trained"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    for rank in (0, 1):
        (stderr,) = logs.glob(f"*/attempt_0/{rank}/stderr.log")
        assert stderr.read_text().split("\n") == ["error: interrupted by SIGTERM", ""], rank
    assert not list((ws / "runs").glob("*/.checkpoint.tmp-*"))
    shown = json.loads(ledgerlm("ledger", "show", "latest", "-w", str(ws), "--json").stdout)
    assert shown["run"]["status"] == "failed"
    assert [e["message"] for e in shown["events"] if e["kind"] == "interrupted"] == ["SIGTERM"]
