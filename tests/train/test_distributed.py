"""Data parallelism with real torchrun processes (gloo on CPU): one step on two ranks
equals the same step in one process, though the ranks hold unequal target counts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

WORKER = Path(__file__).with_name("ddp_step.py")

# The worker's model is float64. One process adds its four micro-batches' gradients in
# turn, ((g0 + g1) + g2) + g3; two ranks add their own two, then each other's sums,
# (g0 + g2) + (g1 + g3); the loss's numerators alike. Not the same order, so not bitwise:
# reordering a sum of four terms moves it by at most 6 x 2**-53 times the sum of the
# terms' magnitudes, under 1e-16 for these gradients (the largest is 0.1; 1.4e-17 is
# measured, 4e-17 in the updated weights). atol 1e-15 covers elements whose terms cancel,
# rtol 1e-12 the rest. One rank's share off by 1e-9 fails them (the skew test below)
# and passed the rtol 1e-6 these tests had.
LOSS_REL = 1e-12
FP64_REORDERED = {"rtol": 1e-12, "atol": 1e-15}


def _step(out: Path, nproc: int, accum: int, *args: str) -> list[tuple[dict, dict]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        cmd += ["--standalone", str(WORKER)]  # rendezvous on a free local port
    cmd += [str(out), "--accum", str(accum), "--rows", "2", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [
        (
            json.loads((out / f"rank{r}.json").read_text()),
            load_file(str(out / f"rank{r}.safetensors")),
        )
        for r in range(nproc)
    ]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize(
    "policy",
    [
        ("token_mean", "exclude"),
        pytest.param(("sequence_mean", "exclude"), marks=pytest.mark.slow),
        pytest.param(("sequence_mean", "zero"), marks=pytest.mark.slow),
    ],
)
def test_two_ranks_make_the_one_process_update(tmp_path, policy, parallel):
    """DDP and FSDP2 both sum gradients over ranks (a mean over ranks would halve them)."""
    objective, empty_rows = policy
    extra = ("--objective", objective, "--empty-rows", empty_rows)
    [(one, one_t)] = _step(tmp_path / "one", 1, 4, *extra)  # 4 micro-batches of 2 rows
    # 2 ranks x 2 micro-batches of 2 rows
    ranks = _step(tmp_path / "two", 2, 2, *extra, "--parallel", parallel)

    # Gradients are reduced once, in the last micro-batch's backward: none before it
    # (FSDP2 holds the unsharded sums, set_requires_gradient_sync; DDP accumulates
    # locally under no_sync, so a gradient is there either way).
    if parallel == "fsdp":
        assert all(meta["grads_seen"] == [False, False] for meta, _ in ranks)
    # The ranks really are uneven: per-rank means averaged would weigh targets unequally.
    local = [meta["local_targets"] for meta, _ in ranks]
    assert local[0] != local[1] and sum(local) == one["targets"]
    for meta, tensors in ranks:
        assert meta["world"] == 2
        for key in ("targets", "tokens", "denominator", "rows"):
            assert meta[key] == one[key], key
        assert meta["loss"] == pytest.approx(one["loss"], rel=LOSS_REL)
        assert tensors.keys() == one_t.keys()
        for name, ref in one_t.items():
            torch.testing.assert_close(tensors[name], ref, **FP64_REORDERED)
    # Both ranks applied the same update: their weights are bitwise equal.
    for name, t in ranks[0][1].items():
        assert torch.equal(t, ranks[1][1][name]), name


@pytest.mark.slow
def test_a_one_process_checkpoint_loads_into_two_sharded_ranks(tmp_path):
    """Weights and optimizer state saved by one process (safetensors) and loaded into an
    FSDP2 model on two ranks: the next update is the one process's next update."""
    ck = tmp_path / "ck"
    _step(tmp_path / "first", 1, 4, "--save", str(ck))  # one update, then a checkpoint
    [(one, one_t)] = _step(tmp_path / "one", 1, 4, "--init-from", str(ck))
    ranks = _step(tmp_path / "two", 2, 2, "--parallel", "fsdp", "--init-from", str(ck))
    first = _step(tmp_path / "again", 1, 4)[0][1]  # the update from the initial weights
    assert any(not torch.equal(first[k], one_t[k]) for k in one_t)  # the load mattered
    for meta, tensors in ranks:
        assert meta["loss"] == pytest.approx(one["loss"], rel=LOSS_REL)
        for name, ref in one_t.items():
            torch.testing.assert_close(tensors[name], ref, **FP64_REORDERED)


@pytest.mark.slow
def test_a_rank_share_off_by_a_billionth_is_caught(tmp_path):
    """The tolerances above have teeth: rank 1's numerators scaled by 1 + 1e-9 (its share
    of the loss and of every gradient) fail them, and passed the 1e-6 they replace."""
    [(one, one_t)] = _step(tmp_path / "one", 1, 4)
    (meta, tensors), _ = _step(tmp_path / "two", 2, 2, "--parallel", "ddp", "--skew", "1e-9")
    assert meta["loss"] != pytest.approx(one["loss"], rel=LOSS_REL)
    assert meta["loss"] == pytest.approx(one["loss"], rel=1e-6)
    grads = [name for name in one_t if name.startswith("grad/")]
    off = [n for n in grads if not torch.allclose(tensors[n], one_t[n], **FP64_REORDERED)]
    assert off == grads  # every gradient
    assert all(torch.allclose(tensors[n], one_t[n], rtol=1e-6, atol=1e-12) for n in grads)


def test_both_ranks_skip_the_update_whose_global_loss_spikes(tmp_path):
    """Only rank 1's share of update 22 is random tokens: rank 0's own loss there is
    ordinary, rank 1's far above the threshold. The update's loss (both shares) spikes,
    and both ranks skip it: the same update, the same events, the same weights."""
    out = tmp_path / "spike"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(WORKER.with_name("ddp_spike.py")), str(out)]
    cmd += ["--steps", "26", "--spike-at", "22"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    weights = [load_file(str(out / f"rank{r}.safetensors")) for r in range(2)]
    for meta in ranks:
        assert meta["skipped"] == [22] and meta["skipped_updates"] == 1
        (event,) = meta["events"]
        assert event["step"] == 22 and event["policy"] == "skip"
        assert event["loss"] > event["factor"] * event["median"]
    assert ranks[0]["events"] == ranks[1]["events"] and ranks[0]["losses"] == ranks[1]["losses"]
    # the attempt at update 22 is the 22nd forward of each rank
    threshold = ranks[0]["events"][0]["factor"] * ranks[0]["events"][0]["median"]
    assert ranks[0]["own_losses"][21] < threshold < ranks[1]["own_losses"][21]
    for name, t in weights[0].items():
        assert torch.equal(t, weights[1][name]), name
