"""The tasks under ``torchrun --nproc-per-node 2`` (gloo, CPU, DDP) give every evaluation
the task metrics one process gives on the same weights: rank r scores items r::2, the
per-item scores are summed over the ranks, so accuracies (choice, exact) are equal
exactly; bits per byte to float rounding (each rank pads its own batches, so a row's
forward may run at another length, which moves the float32 sums in their last bits).
Asynchronous evaluation under torchrun (in pieces, the tasks at the last piece with the
snapshot swapped in) gives the same figures again, with a validation set of an odd
number of batches (5: one rank has one more than the other, and both still end each
evaluation at the same update boundary). Under FSDP (sharded weights, every rank running
as many forwards) the choice and bits-per-byte tasks score the same items on weights
equal to one process's to the shards' rounding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ledgerlm
from .tasks_ranks import tasks_recipe

STEPS = ["--set", "train.max_steps=20", "--set", "train.threads=1", "--set", "eval.every_steps=10"]
DDP = ["--set", "train.parallel=ddp"]  # replicas: bitwise the one-process weights
ASYNC = ["--set", "eval.asynchronous=true", "--set", "eval.max_tokens=5120"]  # 5 batches
EXACTLY = ("acc", "acc_norm", "exact_match", "items")  # and their intervals, stderr


def _show(ws) -> dict:
    return json.loads(ledgerlm("ledger", "show", "latest", "--workspace", str(ws), "--json").stdout)


def _two_ranks(recipe, ws, *more: str, engine: list[str] = DDP) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "ledgerlm", "run", str(recipe), "--workspace", str(ws), *STEPS, *engine, *more]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _show(ws)


def _tasks(evaluation: dict) -> dict[str, float]:
    return {k: v for k, v in evaluation["metrics"].items() if k.startswith("task/")}


def _same_tasks(got: dict, want: dict) -> None:
    assert [e["step"] for e in got["evaluations"]] == [e["step"] for e in want["evaluations"]]
    for a, b in zip(got["evaluations"], want["evaluations"], strict=True):
        assert a["snapshot"] == b["snapshot"]  # the same weights were scored
        ta, tb = _tasks(a), _tasks(b)
        assert ta.keys() == tb.keys() and len(tb) == 19  # 4 keys a metric, items a task
        for key, value in tb.items():
            metric = key.split("/")[2]
            if metric.startswith(EXACTLY):
                assert ta[key] == value, key
            else:  # bpb, its stderr and interval
                assert ta[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The one-process run the two-rank runs are compared with: its folder and record."""
    folder = tmp_path_factory.mktemp("tasks")
    recipe, ws = tasks_recipe(folder), folder / "ws"
    ledgerlm("run", str(recipe), "--workspace", str(ws), *STEPS, "--set", "train.grad_accum=2")
    return folder, _show(ws)


@pytest.mark.slow
def test_two_ranks_score_the_tasks_as_one_process(one_process):
    folder, one = one_process
    recipe, ws = folder / "tasks.toml", folder / "ws"  # its versions reused
    two = _two_ranks(recipe, ws)
    assert two["run"]["id"] != one["run"]["id"]
    assert [e["step"] for e in one["evaluations"]] == [10, 20]
    _same_tasks(two, one)
    # each task's seconds in each evaluation's phase, on the run's rank 0
    phases = {p["id"]: p for p in two["phases"]}
    for e in two["evaluations"]:
        assert set(phases[e["phase_id"]]["detail"]["task_seconds"]) == {"pick", "sums", "prose"}
    # asynchronous: the snapshot scored in pieces at the following update boundaries
    later = _two_ranks(recipe, ws, *ASYNC)
    assert any(p["detail"].get("asynchronous") for p in later["phases"])
    _same_tasks(later, one)


@pytest.mark.slow
@pytest.mark.parametrize("more", [[], ASYNC], ids=["sync", "async"])
def test_sharded_ranks_score_the_likelihood_tasks(one_process, tmp_path, more):
    folder, one = one_process
    recipe = tasks_recipe(tmp_path, names=("pick", "prose"))  # exact: refused under FSDP
    fsdp = ["--set", "train.parallel=fsdp"]
    sharded = _two_ranks(recipe, folder / "ws", *more, engine=fsdp)
    assert [e["step"] for e in sharded["evaluations"]] == [10, 20]
    for a, b in zip(sharded["evaluations"], one["evaluations"], strict=True):
        ta, tb = _tasks(a), _tasks(b)
        assert {k for k in tb if "/sums/" not in k} == ta.keys()
        assert ta["task/pick/items"] == 24 and ta["task/prose/items"] == 16
        for key in ("task/pick/acc", "task/pick/acc_norm"):
            assert abs(ta[key] - tb[key]) <= 1 / 24 + 1e-12, key  # one item at most
        assert ta["task/prose/bpb"] == pytest.approx(tb["task/prose/bpb"], rel=1e-4)
