"""The multi-rank matrix: ``torchrun --nproc-per-node 2`` (gloo on CPU) over engine (DDP,
FSDP2) x evaluation (synchronous, asynchronous) x objective (token mean, sequence mean),
each cell against one process with the same global batch (``train.grad_accum=2``): the
same counters, the same batches per update, the same evaluations, and the losses and
metrics within what the engine's arithmetic allows. Some cells are killed (-9) after a
checkpoint and resumed on two ranks; an asynchronous evaluation still in flight at a
checkpoint is resumed in one process too. The target is confirmed at the first
evaluation and training goes on: the test split is scored on that snapshot (each rank
its shard of it under FSDP, rank 0 under DDP) and on the final weights, as one process
scores them; a cell resumed past the confirmation scores its final weights only.

The default run has the FSDP cell that is asynchronous and resumed (DDP's default
end-to-end check is tests/e2e/test_torchrun.py); the other seven are slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kill_at import KillAt, Killed
from ledgerlm.config import load_recipe
from ledgerlm.lab.resume import resume_run
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

from .conftest import TINY, ledgerlm
from .ranks import killed_after_checkpoint, on_two_ranks, sets, steps

STEPS = 19
# An evaluation every 2 updates: on two ranks its 4 validation batches are scored one per
# rank at each of the next 2 update boundaries, so the last piece of one and the next
# snapshot meet at the same boundary; the final one (step 19) is synchronous. A
# checkpoint every 4 updates is written while that step's evaluation is still scored.
COMMON = [
    f"train.max_steps={STEPS}",
    "eval.every_steps=2",
    "eval.stop_at_target=false",
    "train.checkpoint_every=4",
    "eval.target_loss=7.0",  # confirmed at step 2
    "data.test_fraction=0.1",
]
EVALUATED = [*range(2, STEPS, 2), STEPS]
OWN = {"seconds", "at"}  # each run's own times

SLOW = pytest.mark.slow
CELLS = [
    pytest.param("fsdp", True, "token_mean", True, id="fsdp-async-token-resumed"),
    pytest.param("ddp", True, "sequence_mean", True, id="ddp-async-sequence-resumed", marks=SLOW),
    pytest.param("fsdp", False, "token_mean", False, id="fsdp-sync-token", marks=SLOW),
    pytest.param("fsdp", False, "sequence_mean", True, id="fsdp-sync-sequence-resumed", marks=SLOW),
    pytest.param("fsdp", True, "sequence_mean", False, id="fsdp-async-sequence", marks=SLOW),
    pytest.param("ddp", False, "token_mean", True, id="ddp-sync-token-resumed", marks=SLOW),
    pytest.param("ddp", False, "sequence_mean", False, id="ddp-sync-sequence", marks=SLOW),
    pytest.param("ddp", True, "token_mean", False, id="ddp-async-token", marks=SLOW),
]


def _overrides(asynchronous: bool, objective: str) -> list[str]:
    return [
        *COMMON,
        f"eval.asynchronous={str(asynchronous).lower()}",
        f"train.objective={objective}",
    ]


def _runs(ws: Path) -> list[dict]:
    """The summaries of the workspace's runs, oldest first (read here: no command)."""
    with Ledger(ws / "ledger.db") as ledger:
        return [ledger.run_summary(r["id"]) for r in reversed(ledger.list_runs())]


@pytest.mark.parametrize(("engine", "asynchronous", "objective", "resumed"), CELLS)
def test_two_ranks_make_the_one_process_run(tmp_path, engine, asynchronous, objective, resumed):
    ws = tmp_path / "ws"
    run = ["run", str(TINY), "-w", str(ws), *sets(*_overrides(asynchronous, objective))]
    two_ranks = [*run, *sets(f"train.parallel={engine}")]
    if resumed:
        killed_after_checkpoint(two_ranks, ws, 4)
        (killed,) = _runs(ws)
        assert killed["run"]["status"] == "running", "the run finished before the kill"
        on_two_ranks("resume", killed["run"]["id"], "-w", str(ws))
    else:
        on_two_ranks(*two_ranks)
    ledgerlm(*run, *sets("train.grad_accum=2"))
    two, one = _runs(ws)

    assert two["run"]["status"] == one["run"]["status"] == "reached"
    if resumed:
        assert [e["kind"] for e in two["events"]].count("resume") == 1
    assert two["counters"] == one["counters"]  # tokens, targets, rows, updates: global
    s2, s1 = steps(ws, two["run"]["id"]), steps(ws, one["run"]["id"])
    assert [r["step"] for r in s2] == list(range(1, STEPS + 1))  # none twice after a resume
    assert [(r["tokens"], r["targets"]) for r in s2] == [(r["tokens"], r["targets"]) for r in s1]
    assert [e["step"] for e in two["evaluations"]] == EVALUATED
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        assert (a["step"], a["tokens"], a["targets"]) == (b["step"], b["tokens"], b["targets"])
    if asynchronous:  # scored while training went on, in pieces after the update scored
        pieces = [p for p in two["phases"] if p["detail"].get("asynchronous")]
        assert {p["detail"]["snapshot_step"] for p in pieces} == set(EVALUATED[:-1])
        assert any(p["step_start"] > p["detail"]["snapshot_step"] for p in pieces)

    _same_tests(two, one, engine, resumed)
    if engine == "ddp":
        # Two replicas sum the two micro-batches' gradients in the order one process
        # accumulates them: the updates, and so the weights, are bitwise one process's.
        same = [[{k: v for k, v in r.items() if k not in OWN} for r in rows] for rows in (s2, s1)]
        assert same[0] == same[1]
        for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
            assert a["snapshot"] == b["snapshot"]
            # each rank sums its half of the validation batches (float64), then the ranks
            for name, value in b["metrics"].items():
                assert a["metrics"][name] == pytest.approx(value, rel=1e-9), name
        return
    # FSDP2 is not bitwise one process: each rank reduce-scatters the gradients and
    # updates only its shards, and fp32 arithmetic over shards rounds otherwise than
    # over whole tensors (the gradient norm is summed shard by shard and then over the
    # ranks: it differs in its 7th digit; the weights, and so the snapshot digests,
    # differ in their last bits, ~1e-9 in the evaluations here). Once clipping is
    # active the differing norm changes every update after it, which Adam carries on:
    # 1e-5 bounds that over 19 updates, and stale or wrong weights miss it by far.
    for a, b in zip(s2, s1, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        for name, value in b["metrics"].items():
            assert a["metrics"][name] == pytest.approx(value, rel=1e-5), (a["step"], name)


def _same_tests(two: dict, one: dict, engine: str, resumed: bool) -> None:
    """The test records of two ranks against one process's: the confirming snapshot
    (step 2) and the final weights, or the final weights alone after a resume past the
    confirmation; the figures to the engine's tolerance, DDP's digests bitwise."""
    tests = [[json.loads(e["message"]) for e in s["events"] if e["kind"] == "test_evaluation"]
             for s in (two, one)]  # fmt: skip
    assert [(t["role"], t["step"]) for t in tests[1]] == [("confirming", 2), ("final", STEPS)]
    if resumed:
        (final,) = tests[0]
        assert "not kept across a resume" in final["note"]
        pairs = [(final, tests[1][1])]
    else:
        assert tests[0][0]["snapshot"] == two["evaluations"][0]["snapshot"]
        pairs = list(zip(*tests, strict=True))
    for a, b in pairs:
        assert (a["role"], a["step"], a["targets"]) == (b["role"], b["step"], b["targets"])
        assert a["snapshot"] == b["snapshot"] or engine == "fsdp"  # shards hash apart
        for name, value in b["metrics"].items():
            rel = 1e-9 if engine == "ddp" else 1e-5
            assert a["metrics"][name] == pytest.approx(value, rel=rel), (a["role"], name)


def test_an_asynchronous_evaluation_in_flight_at_a_checkpoint_is_recorded_after_resume(
    tmp_path,
):
    """One process: the run stops (as a killed process would) right after the checkpoint
    of an update whose evaluation is still being scored in the background; the resume
    records that evaluation, and every other, as the uninterrupted run did."""
    ws = Workspace(tmp_path / "ws")
    recipe = load_recipe(TINY, [*_overrides(True, "token_mean"), "train.threads=1"])
    full = run_recipe(recipe, ws)
    with pytest.raises(Killed):
        run_recipe(recipe, ws, callbacks=[KillAt(12)])  # after the checkpoint at 12
    with Ledger(ws.ledger_path) as ledger:
        (run_id,) = [r["id"] for r in ledger.list_runs() if r["id"] != full.run_id]
        stopped = ledger.run_summary(run_id)
    assert [e["step"] for e in stopped["evaluations"]] == [2, 4, 6, 8, 10]  # 12's in flight

    resumed = resume_run(ws, run_id).summary
    expected = full.summary
    assert [e["step"] for e in expected["evaluations"]] == EVALUATED
    keys = ("step", "tokens", "targets", "snapshot", "metrics")
    pick = [[{k: e[k] for k in keys} for e in s["evaluations"]] for s in (resumed, expected)]
    assert pick[0] == pick[1]  # the same snapshots, scored bitwise alike
    assert resumed["counters"] == expected["counters"]
    with Ledger(ws.ledger_path) as ledger:
        rows = [ledger.steps(r) for r in (run_id, full.run_id)]
    same = [[{k: v for k, v in r.items() if k not in OWN} for r in x] for x in rows]
    assert same[0] == same[1]
