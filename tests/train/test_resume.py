"""A run interrupted at any step and resumed from its last checkpoint ends with weights
bitwise equal to an uninterrupted run: in process, and through ``kill -9`` of the CLI."""

import fcntl
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cli_runner import checkpoint_step
from fake_store import two_domain_store
from kill_at import KillAt, Killed
from ledgerlm.config import ModelConfig, PackConfig, TrainConfig
from ledgerlm.lab.resume import resume_run
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.mixture.schedule import Segment
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.loader import train_batches
from ledgerlm.train.checkpoint import (
    STATE,
    TENSORS,
    WEIGHTS,
    load_checkpoint,
    optimizer_state,
    save_checkpoint,
)
from ledgerlm.train.checkpointing import CheckpointCallback, load_training
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"
PACK = PackConfig(seq_len=16)
VOCAB = 60


def _parts(optimizer: str, init_seed: int):
    cfg = TrainConfig(
        max_steps=14,
        micro_batch_rows=2,
        grad_accum=2,
        warmup_steps=3,
        lr=3e-3,
        optimizer=optimizer,
        checkpoint_every=4,
    )
    torch.manual_seed(init_seed)
    model = GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2), VOCAB)
    return model, build_optimizer(model, cfg), cfg


def _trainer(model, opt, cfg, store, folder, *extra, cursor=None, mixture=None):
    stream = train_batches(
        store, PACK, cfg.micro_batch_rows, cfg.seed, cursor=cursor, mixture=mixture
    )
    callbacks = [CheckpointCallback(folder, cfg.checkpoint_every), *extra]
    return Trainer(model, opt, cfg, stream, "isolated", callbacks=callbacks)


# A staged mixture: natural for the first third of the 14 x 64-token updates, then
# three quarters of domain "b" (two domains alternate in the store).
STAGED = [Segment(300, {"a": 0.5, "b": 0.5}, natural=True), Segment(None, {"a": 0.25, "b": 0.75})]


@pytest.mark.parametrize(
    ("optimizer", "mixture"), [("adamw", None), ("muon", None), ("adamw", STAGED)]
)
def test_resumed_training_is_bitwise_the_uninterrupted_one(tmp_path, optimizer, mixture):
    store = two_domain_store(vocab=VOCAB)
    model, opt, cfg = _parts(optimizer, 0)
    reference = _trainer(model, opt, cfg, store, tmp_path / "ref", mixture=mixture)
    reference.fit()

    model, opt, cfg = _parts(optimizer, 0)
    with pytest.raises(Killed):
        _trainer(model, opt, cfg, store, tmp_path / "run", KillAt(10), mixture=mixture).fit()

    fresh, fresh_opt, cfg = _parts(optimizer, 1)  # other initial weights: all must come back
    state = load_training(tmp_path / "run", fresh, fresh_opt)
    assert state["step"] == 8 and state["data"]["offset" if mixture else "cursor"] is not None
    resumed = _trainer(
        fresh, fresh_opt, cfg, store, tmp_path / "run", cursor=state["data"], mixture=mixture
    )
    resumed.load_state_dict(state["trainer"])
    resumed.fit()

    ref_weights, weights = reference.model.state_dict(), fresh.state_dict()
    assert ref_weights.keys() == weights.keys()
    assert all(torch.equal(ref_weights[k], weights[k]) for k in ref_weights)
    ref_tensors, ref_structure = optimizer_state(reference.optimizer)
    tensors, structure = optimizer_state(fresh_opt)
    assert structure == ref_structure
    assert all(torch.equal(ref_tensors[k], tensors[k]) for k in ref_tensors)
    assert asdict(resumed.state) == asdict(reference.state)  # counters and full history
    assert resumed.batches.state_dict() == reference.batches.state_dict()
    consumed = reference.state.domain_tokens
    assert sum(consumed.values()) == reference.state.tokens
    if mixture:  # the second stage leans on b
        assert consumed["b"] > 1.3 * consumed["a"]


def test_checkpoint_files_are_checked_and_hold_no_pickle(tmp_path):
    store = two_domain_store(vocab=VOCAB)
    model, opt, cfg = _parts("muon", 0)
    trainer = _trainer(model, opt, cfg, store, tmp_path / "ck")
    trainer.fit()
    folder = tmp_path / "ck"
    assert sorted(p.name for p in folder.iterdir()) == sorted([STATE, TENSORS, WEIGHTS])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary left
    state = json.loads((folder / STATE).read_text())
    assert set(state["optimizer"]) == {"adamw", "muon"}
    assert any(k.startswith("optimizer/muon/") for k in load_file(str(folder / TENSORS)))
    for name in (TENSORS, STATE):
        data = bytearray((folder / name).read_bytes())
        at = len(data) // 2 if name == TENSORS else data.index(b'"step": ') + 9
        data[at] ^= 0x01
        original = (folder / name).read_bytes()
        (folder / name).write_bytes(bytes(data))
        with pytest.raises(ValueError, match="checksum mismatch"):
            load_training(folder, *_parts("muon", 0)[:2])
        (folder / name).write_bytes(original)
    load_training(folder, *_parts("muon", 0)[:2])


def test_a_save_killed_between_renames_leaves_the_previous_checkpoint(tmp_path):
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), VOCAB)
    folder = save_checkpoint(tmp_path / "ck", model, {"step": 3})
    os.rename(folder, tmp_path / ".ck.previous")  # what a kill right after the first rename leaves
    (tmp_path / ".ck.tmp-dead").mkdir()  # and a half-written temporary
    assert load_checkpoint(folder, model)["step"] == 3
    save_checkpoint(folder, model, {"step": 4})
    assert load_checkpoint(folder, model)["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# -- the real thing: kill -9 the command line, resume it ------------------------------

OVERRIDES = [
    "train.checkpoint_every=5",
    "train.max_steps=40",
    "eval.stop_at_target=false",
    "eval.every_steps=10",
    "train.threads=1",
]


def _cli(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("ledgerlm")), *args]


def _run_args(ws: Path) -> list[str]:
    sets = [x for o in OVERRIDES for x in ("--set", o)]
    return _cli("run", str(TINY), "-w", str(ws), *sets)


@pytest.mark.slow
def test_kill_9_and_resume_gives_the_uninterrupted_weights(tmp_path):
    full_ws, ws = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_run_args(full_ws), check=True, capture_output=True, timeout=600)

    proc = subprocess.Popen(_run_args(ws), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_after = random.Random().randint(10, 20)
    deadline = time.monotonic() + 300
    while checkpoint_step(ws) < kill_after and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed"
    time.sleep(random.Random().uniform(0, 0.1))  # anywhere in the next few updates
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read().decode()

    with Ledger(ws / "ledger.db") as ledger:
        (run_id,) = [r["id"] for r in ledger.list_runs()]
        killed = ledger.run_summary(run_id)
    assert killed["run"]["status"] == "running"
    with open(ws / "runs" / run_id / ".lock") as lock:  # a live trainer holds this lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(LedgerError, match="another process"):
            resume_run(Workspace(ws), run_id)

    out = subprocess.run(
        _cli("resume", run_id, "-w", str(ws)), capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr

    (full_run,) = list((full_ws / "runs").iterdir())
    expected = load_file(str(full_run / "checkpoint" / WEIGHTS))
    got = load_file(str(ws / "runs" / run_id / "checkpoint" / WEIGHTS))
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    with Ledger(ws / "ledger.db") as ledger:
        assert [r["id"] for r in ledger.list_runs()] == [run_id]
        s = ledger.run_summary(run_id)
        assert [r["step"] for r in ledger.steps(run_id)] == list(range(1, 41))
    assert s["run"]["status"] == "not reached"
    restores = [p for p in s["phases"] if p["kind"] == "restore"]
    assert len(restores) == 1 and restores[0]["seconds"] > 0
    assert kill_after <= restores[0]["step_end"] < 40
    assert [e["step"] for e in s["evaluations"]] == [10, 20, 30, 40]  # none twice
    assert s["counters"]["optimizer_updates"] == 40
    # The killed process's open phase was closed at its last heartbeat and is charged.
    assert killed["open_phases"] >= 1 and s["open_phases"] == 0
    closed = [p for p in s["phases"] if p["detail"].get("closed_by") == "resume"]
    assert len(closed) == killed["open_phases"]
    assert all(p["seconds"] >= 0 and p["detail"]["killed"] for p in closed)
    assert any(e["kind"] == "closed_open_phases" for e in s["events"])
    # Every second of both processes is in a phase; the time from the kill to the
    # resume's restore is interrupted (not charged), not uncovered.
    cov = s["coverage"]
    assert cov["uncovered_seconds"] < min(0.2, 0.01 * cov["wall_seconds"])
    assert cov["interrupted_seconds"] > 0 and restores[0]["detail"]["resume"] is True
    with Ledger(full_ws / "ledger.db") as ledger:
        (full_id,) = [r["id"] for r in ledger.list_runs()]
        full = ledger.run_summary(full_id)
    assert [e["snapshot"] for e in s["evaluations"]] == [e["snapshot"] for e in full["evaluations"]]
    assert s["counters"] == full["counters"]
    with sqlite3.connect(ws / "ledger.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    again = subprocess.run(
        _cli("resume", run_id, "-w", str(ws)), capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 2 and "nothing to resume" in again.stderr
