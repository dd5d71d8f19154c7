"""A one-process (safetensors) checkpoint loaded into an FSDP2 model on two torchrun
ranks (gloo, CPU): rank 0 alone reads the tensor files and broadcasts them, and every
rank ends with the checkpoint's weights, optimizer state and generator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ledgerlm.config import TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.train.checkpoint import STATE, TENSORS, WEIGHTS, save_checkpoint
from ledgerlm.train.optim import build_optimizer
from ledgerlm.workspace import file_sha256

WORKER = Path(__file__).with_name("broadcast_load.py")
sys.path.insert(0, str(WORKER.parent))
from broadcast_load import CFG, VOCAB  # noqa: E402


def _one_process_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    """A checkpoint after one update with optimizer state; the tensors a loaded model
    must hold, and the draws its generator makes next."""
    torch.manual_seed(0)
    model = GPT(CFG, VOCAB)
    optimizer = build_optimizer(model, TrainConfig())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    save_checkpoint(folder, model, {"step": 1}, optimizer)
    draws = torch.rand(4).tolist()
    names = {id(p): n for n, p in model.named_parameters()}
    expected = {f"weight/{n}": p.detach().clone() for n, p in model.named_parameters()}
    for p, st in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            expected[f"{key}/{names[id(p)]}"] = st[key].clone()
    return expected, draws


def _on_two_ranks(folder: Path, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(WORKER), str(folder), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_only_rank_0_reads_a_one_process_checkpoint_into_sharded_ranks(tmp_path):
    expected, draws = _one_process_checkpoint(tmp_path / "ck")
    out = tmp_path / "out"
    ranks = _on_two_ranks(tmp_path / "ck", out)
    assert sorted(ranks[0]["read"]) == sorted([WEIGHTS, TENSORS])
    assert ranks[1]["read"] == []  # the other rank got every tensor from rank 0
    for r, meta in enumerate(ranks):
        got = load_file(str(out / f"rank{r}.st"))
        assert got.keys() == expected.keys()
        for name, ref in expected.items():
            assert torch.equal(got[name], ref), (r, name)
        assert meta["steps"] == [1.0]
        assert meta["draws"] == draws  # the one process's generator, on every rank


@pytest.mark.slow
def test_every_rank_refuses_a_weights_only_checkpoint_to_resume_from(tmp_path):
    """A checkpoint of the oldest format (weights and their checksum only): rank 0 alone
    would find no state tensors to read, so every rank checks first and says so."""
    folder = tmp_path / "ck"
    torch.manual_seed(0)
    save_checkpoint(folder, GPT(CFG, VOCAB), {"step": 1})
    (folder / TENSORS).unlink()
    (folder / STATE).write_text(json.dumps({"weights_sha256": file_sha256(folder / WEIGHTS)}))
    for meta in _on_two_ranks(folder, tmp_path / "out"):
        assert "weights-only checkpoint, nothing to resume from" in meta["error"]
