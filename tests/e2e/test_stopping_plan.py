"""The stopping plan fixed before a run (``eval.patience``, ``eval.project``): a tiny run
whose target is out of reach ends "not reached" early, long before ``max_steps``, with
an ``early_stop`` event holding its reason, and ``ledger show`` says why it stopped."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest

from .conftest import TINY, ledgerlm
from .ranks import ENV, sets, show, steps, torchrun

# A target no tiny run reaches; every first evaluation beats min_delta 5 nat/token by
# none of the next (the loss starts near 6.2), so patience 2 stops at the third.
PATIENCE = ["eval.target_loss=0.5", "eval.every_steps=5", "eval.patience=2", "eval.min_delta=5"]
PATIENCE_STOP = (15, "not reached (no improvement in 2 evaluations)")
# The curve after 6 evaluations (60 of 200 updates) is near 4.85 and flattening: a
# power law through it puts 1.0 far below even the optimistic end at the budget.
PROJECT = ["eval.target_loss=1.0", "eval.every_steps=10", "eval.project=true"]
PROJECT_STOP = (60, "not reached (projected)")


def _stopped(ws, at: int, reason: str, rule: str) -> dict:
    """The run's summary, once checked: it ended not reached at ``at`` with the stop."""
    summary = show(ws)
    assert summary["run"]["status"] == "not reached"
    assert summary["time_to_target"]["reached"] is False
    ends = [e for e in summary["events"] if e["kind"] == "train_end"]
    stops = [e for e in summary["events"] if e["kind"] == "early_stop"]
    assert [(e["step"], e["message"]) for e in ends] == [(at, reason)]
    [stop] = stops
    detail = json.loads(stop["message"])
    assert stop["step"] == at and (detail["rule"], detail["reason"]) == (rule, reason)
    assert detail["status"] == "not reached"
    assert len(steps(ws, summary["run"]["id"])) == at  # no update after the stop's
    assert summary["evaluations"][-1]["step"] == at
    return {"summary": summary, "detail": detail}


def _on_two_ranks(*args: str, timeout: float = 240) -> None:
    """``torchrun --nproc-per-node 2 -m ledgerlm ARGS``, which must end within
    ``timeout`` (about 15 s alone): ranks that stopped apart wait in a collective for
    a peer that never comes, spinning, so on a timeout every rank is killed."""
    proc = subprocess.Popen(
        torchrun(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            p.kill()
        proc.communicate()
        pytest.fail(f"the two ranks did not end within {timeout:g} s: they stopped apart")
    assert proc.returncode == 0, err.decode()[-3000:]


def test_patience_ends_a_run_that_stopped_improving(tmp_path):
    ws = tmp_path / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), *sets(*PATIENCE))
    found = _stopped(ws, *PATIENCE_STOP, "patience")
    assert found["detail"]["best_step"] == 5 and found["detail"]["evaluations"] == 2
    [contract] = [
        json.loads(e["message"])
        for e in found["summary"]["events"]
        if e["kind"] == "target_contract"
    ]
    assert (contract["patience"], contract["min_delta"], contract["project"]) == (2, 5.0, False)
    text = ledgerlm("ledger", "show", "latest", "-w", str(ws)).stdout
    assert "stopping plan: patience 2, min_delta 5" in text
    assert f"training stopped at step 15: {PATIENCE_STOP[1]}; best loss" in text


def test_a_projection_ends_a_run_whose_curve_misses_the_target_at_the_budget(tmp_path):
    ws = tmp_path / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), *sets(*PROJECT))
    d = _stopped(ws, *PROJECT_STOP, "project")["detail"]
    assert d["budget_tokens"] == 200 * 16 * 64  # max_steps x rows x seq_len
    assert len(d["points"]) == 6 and d["points"][-1][0] == 60 * 16 * 64
    assert 1.0 < d["interval"][0] <= d["projected"] <= d["interval"][1]
    assert set(d["fit"]) == {"E", "A", "alpha", "n"}
    text = ledgerlm("ledger", "show", "latest", "-w", str(ws)).stdout
    assert "training stopped at step 60: not reached (projected); loss projected" in text


# On two ranks (32 rows an update) the curve at 6 evaluations puts the optimistic end at
# the two-rank budget near 4.35 and at the one-rank budget near 4.59: a rank that took
# the one-rank budget would stop at step 60 while the others went on.
TWO_RANK_PROJECT = ["eval.target_loss=4.45", "eval.every_steps=10", "eval.project=true"]


@pytest.mark.slow
def test_a_patience_stop_ends_both_ranks_after_the_same_update(tmp_path):
    """Each rank decides from the same reduced evaluations: one that went on alone would
    wait in the next update's all-reduce for a peer that has exited, and fail."""
    ws = tmp_path / "ws"
    _on_two_ranks("run", str(TINY), "-w", str(ws), *sets("train.parallel=ddp", *PATIENCE))
    _stopped(ws, *PATIENCE_STOP, "patience")


@pytest.mark.slow
def test_every_rank_projects_to_the_same_two_rank_budget(tmp_path):
    ws = tmp_path / "ws"
    _on_two_ranks("run", str(TINY), "-w", str(ws), *sets("train.parallel=ddp", *TWO_RANK_PROJECT))
    [stop] = [e for e in show(ws)["events"] if e["kind"] == "early_stop"]
    assert stop["step"] > 60  # past where the one-rank budget would have stopped a rank
    d = _stopped(ws, stop["step"], PROJECT_STOP[1], "project")["detail"]
    assert d["budget_tokens"] == 200 * 2 * 16 * 64  # two ranks of 16 rows: twice the budget
