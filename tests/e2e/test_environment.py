"""A run records the environment it trained in (an ``environment`` event): the device,
the versions, whether TF32 was in force and every NCCL variable; ``train.tf32`` on the
CPU is said, recorded as not in force, and trains on."""

from __future__ import annotations

import os

import torch

from ledgerlm.ledger import events
from ledgerlm.ledger.store import Ledger

from .conftest import TINY, ledgerlm


def _summaries(ws) -> list[dict]:
    """Every run's summary, the latest first."""
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        return [ledger.run_summary(run["id"]) for run in ledger.list_runs()]


def test_a_run_records_its_environment(tiny_workspace, tiny_run_id):
    (summary,) = [s for s in _summaries(tiny_workspace) if s["run"]["id"] == tiny_run_id]
    record = events.latest_json(summary, events.ENVIRONMENT)
    assert record is not None, "the run recorded no environment"
    assert record["device"] == "cpu" and record["ranks"] == 1
    assert record["torch"] == torch.__version__ and record["tf32"] is False
    # the run's process had this test's environment
    assert record["nccl"] == {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}


def test_tf32_on_the_cpu_is_said_and_recorded_as_not_in_force(tiny_workspace_copy, tiny_run_id):
    ws = tiny_workspace_copy  # its data and tokens are reused: only training runs
    over = ["train.tf32=true", "train.max_steps=2", "eval.every_steps=1", "train.threads=1"]
    proc = ledgerlm("run", str(TINY), "-w", str(ws), *[x for o in over for x in ("--set", o)])
    assert "train.tf32 = true changes nothing on cpu" in proc.stdout + proc.stderr
    summary = _summaries(ws)[0]
    assert summary["run"]["id"] != tiny_run_id
    assert summary["run"]["recipe"]["train"]["tf32"] is True  # what the recipe asked
    assert events.latest_json(summary, events.ENVIRONMENT)["tf32"] is False  # what was in force
