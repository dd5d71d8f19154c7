"""``torchrun --nproc-per-node 2 -m ledgerlm run``: rank 0 keeps the ledger, both ranks
train, and the run makes the updates one process makes with twice the accumulation."""

import json
import os
import subprocess
import sys

from ledgerlm.ledger.store import Ledger

from .conftest import TINY, ledgerlm

STEPS = ["--set", "train.max_steps=20", "--set", "train.threads=1"]
DDP = ["--set", "train.parallel=ddp"]  # replicas: bitwise the one-process weights


def _show(ws) -> dict:
    return json.loads(ledgerlm("ledger", "show", "latest", "--workspace", str(ws), "--json").stdout)


def test_two_ranks_train_the_single_process_model(tmp_path):
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "ledgerlm", "run", str(TINY), "--workspace", str(ws), *STEPS, *DDP]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("time per phase") == 1  # only rank 0 reports
    two = _show(ws)

    ledgerlm("run", str(TINY), "--workspace", str(ws), *STEPS, "--set", "train.grad_accum=2")
    one = _show(ws)
    assert one["run"]["id"] != two["run"]["id"]

    contract = [json.loads(e["message"]) for e in two["events"] if e["kind"] == "target_contract"]
    assert contract[0]["ranks"] == 2
    assert two["counters"] == one["counters"]  # tokens, targets, rows, updates: global counts
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        assert a["step"] == b["step"] and a["tokens"] == b["tokens"]
        # Two ranks sum the two micro-batches' gradients in the order one process
        # accumulates them, so the weights are bitwise the same.
        assert a["snapshot"] == b["snapshot"]
        for name, value in b["metrics"].items():
            assert abs(a["metrics"][name] - value) <= 1e-9 * abs(value), name
    with Ledger(ws / "ledger.db") as ledger:
        steps = [ledger.steps(r["run"]["id"]) for r in (two, one)]
    # per-update rows: global counts, the same updates (their times are each run's own)
    own = {"seconds", "at"}
    same = [[{k: v for k, v in r.items() if k not in own} for r in rows] for rows in steps]
    assert len(same[0]) == 20 and same[0] == same[1]
    assert all(r["seconds"] > 0 for rows in steps for r in rows)
