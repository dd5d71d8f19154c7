"""FSDP2 under real torchrun processes (gloo on CPU): a sharded run keeps the ledger of
one process, its DCP checkpoints resume bitwise on the same rank count and, resharded,
on one process with the same global batches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ledgerlm.config import load_recipe
from ledgerlm.model.gpt import GPT
from ledgerlm.train.checkpoint import load_checkpoint
from ledgerlm.workspace import read_json

from .conftest import TINY, ledgerlm
from .ranks import killed_after_checkpoint, on_two_ranks, sets, show, steps


def _weights(ws: Path) -> dict[str, torch.Tensor]:
    """The run's final weights, whole, read back in this (single) process."""
    (run_dir,) = list((ws / "runs").iterdir())
    recipe = load_recipe(run_dir / "recipe.toml")
    manifest = next((ws / "tokens").iterdir()) / "manifest.json"
    model = GPT(recipe.model, int(read_json(manifest)["tokenizer"]["vocab_size"]))
    load_checkpoint(run_dir / "checkpoint", model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_a_sharded_run_keeps_the_ledger_of_one_process(tmp_path):
    ws = tmp_path / "ws"
    over = sets("train.max_steps=20", "train.parallel=fsdp")
    on_two_ranks("run", str(TINY), "-w", str(ws), *over)
    two = show(ws)
    state = read_json(ws / "runs" / two["run"]["id"] / "checkpoint" / "state.json")
    assert state["format"] == "dcp" and state["ranks"] == 2
    ledgerlm("run", str(TINY), "-w", str(ws), *sets("train.max_steps=20", "train.grad_accum=2"))
    one = show(ws)
    assert two["counters"] == one["counters"]
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        assert (a["step"], a["tokens"], a["targets"]) == (b["step"], b["tokens"], b["targets"])
        for name, value in b["metrics"].items():
            assert a["metrics"][name] == pytest.approx(value, rel=1e-5), name
    s2, s1 = steps(ws, two["run"]["id"]), steps(ws, one["run"]["id"])
    assert [(r["tokens"], r["targets"]) for r in s2] == [(r["tokens"], r["targets"]) for r in s1]
    for a, b in zip(s2, s1, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_on_two_ranks_bitwise_and_on_one_to_1e5(tmp_path):
    over = sets("train.max_steps=40", "train.parallel=fsdp", "train.checkpoint_every=5")
    over += sets("eval.stop_at_target=false", "eval.every_steps=10")
    full, killed = tmp_path / "full", tmp_path / "killed"
    on_two_ranks("run", str(TINY), "-w", str(full), *over)

    killed_after_checkpoint(["run", str(TINY), "-w", str(killed), *over], killed, 10)
    assert show(killed)["run"]["status"] == "interrupted", "the run finished before the kill"
    alone = tmp_path / "alone"
    shutil.copytree(killed, alone)
    run_id = show(killed)["run"]["id"]

    on_two_ranks("resume", run_id, "-w", str(killed))
    expected = _weights(full)
    got = _weights(killed)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    ledgerlm("resume", run_id, "-w", str(alone))  # one process: the checkpoint resharded
    full_steps = steps(full, show(full)["run"]["id"])
    alone_steps = steps(alone, run_id)
    assert [r["step"] for r in alone_steps] == list(range(1, 41))
    for a, b in zip(alone_steps, full_steps, strict=True):
        assert (a["tokens"], a["targets"]) == (b["tokens"], b["targets"])  # same batches
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)


def _continued_rows(summary: dict) -> dict:
    event = next(e for e in summary["events"] if e["kind"] == "continued_pretraining")
    return {(r["set"], r["domain"]): r for r in json.loads(event["message"])["rows"]}


@pytest.mark.slow
def test_continued_pretraining_on_two_sharded_ranks_scores_as_one_process(tmp_path):
    """``--init-from`` under torchrun: every rank starts from the run's weights, and the
    before/after scores and the evaluations are those of one process."""
    ws = tmp_path / "ws"
    short = sets("train.max_steps=10", "eval.stop_at_target=false", "eval.every_steps=5")
    ledgerlm("run", str(TINY), "-w", str(ws), *short)
    base = show(ws)["run"]["id"]
    recipe = tmp_path / "more.toml"
    recipe.write_text(TINY.read_text().replace('name = "tiny"', 'name = "more"'))
    on_two_ranks("train", str(recipe), "--init-from", base, "-w", str(ws), *short)
    two = show(ws)
    assert two["run"]["recipe"]["train"]["init_from"] == base
    ledgerlm(
        "train", str(recipe), "--init-from", base, "-w", str(ws), *short,
        "--set", "train.grad_accum=2",
    )  # fmt: skip
    one = show(ws)
    a, b = _continued_rows(two), _continued_rows(one)
    assert a.keys() == b.keys() and len(a) >= 4
    for key, row in b.items():
        for field in ("before", "after"):
            assert a[key][field] == pytest.approx(row[field], rel=1e-5), (key, field)
    assert [e["step"] for e in two["evaluations"]] == [e["step"] for e in one["evaluations"]]
    for x, y in zip(two["evaluations"], one["evaluations"], strict=True):
        assert x["metrics"]["loss"] == pytest.approx(y["metrics"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_asynchronous_evaluation_on_two_ranks_gives_the_one_process_evaluations(tmp_path):
    """Under torchrun an asynchronous evaluation is scored in pieces at the next update
    boundaries (a thread cannot join collectives): the same snapshots and figures as the
    one-process background evaluation."""
    ws = tmp_path / "ws"
    common = ["train.max_steps=20", "eval.asynchronous=true", "eval.every_steps=5"]
    over = sets(*common, "eval.stop_at_target=false")
    on_two_ranks("run", str(TINY), "-w", str(ws), *over, *sets("train.parallel=ddp"))
    two = show(ws)
    ledgerlm("run", str(TINY), "-w", str(ws), *over, *sets("train.grad_accum=2"))
    one = show(ws)
    assert [e["step"] for e in two["evaluations"]] == [5, 10, 15, 20]
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        assert (a["step"], a["snapshot"], a["tokens"]) == (b["step"], b["snapshot"], b["tokens"])
        for name, value in b["metrics"].items():
            assert a["metrics"][name] == pytest.approx(value, rel=1e-9), name
    pieces = [p for p in two["phases"] if p["detail"].get("asynchronous")]
    assert {p["detail"]["snapshot_step"] for p in pieces} == {5, 10, 15, 20}
    later = [p for p in pieces if p["step_start"] > p["detail"]["snapshot_step"]]
    assert later, "no piece ran after the update it scores: training did not go on"
