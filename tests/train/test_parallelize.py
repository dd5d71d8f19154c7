"""The one parallelize step (train/parallelize.py): FSDP2 with bf16 parameters under real
torchrun processes (gloo on CPU, where FSDP2 gathers bf16 parameters as on CUDA), and
what it applies in one process.

Under a bf16 policy the loss weights must reach the head in fp64 and the RoPE tables
in fp32: FSDP's default policy casts every floating-point forward input to the
parameter dtype, which rounded sequence-mean weights 1/n by up to 2**-9."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.distributed import World
from ledgerlm.train.evaluate import evaluate
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.parallelize import mixed_precision, pad_rows, parallelize

WORKER = Path(__file__).with_name("fsdp_precision.py")


def _two_ranks(out: Path, *args: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(WORKER), str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _assert_inputs_kept(rank: dict) -> None:
    """The bf16 policy on the root and every block, forward inputs not cast: fp64 loss
    weights, fp32 RoPE tables, and bf16 hidden states (the policy was in force)."""
    assert [p["module"] for p in rank["policies"]] == ["", "blocks.0", "blocks.1"]
    for p in rank["policies"]:
        assert (p["param_dtype"], p["reduce_dtype"]) == ("torch.bfloat16", "torch.float32")
        assert p["cast_forward_inputs"] is False, p["module"]
    assert rank["hidden"] == ["torch.bfloat16"]  # the layers ran on bf16 parameters
    assert rank["param_dtypes"] == ["torch.float32"]  # stored (sharded) in fp32
    assert rank["weights"] == ["torch.float64"]
    assert rank["rope"] == ["torch.float32"]


def test_bf16_fsdp_keeps_the_loss_weights_fp64_inside_forward(tmp_path):
    ranks = _two_ranks(tmp_path / "out")
    for rank in ranks:
        _assert_inputs_kept(rank)
    assert ranks[0]["loss"] == ranks[1]["loss"]  # one global update on both ranks


def test_the_check_fails_under_the_policy_that_casts_forward_inputs(tmp_path):
    """FSDP's default policy (cast_forward_inputs on) in place of ``mixed_precision``:
    the weights reach the head in bf16, and the check above says so."""
    ranks = _two_ranks(tmp_path / "out", "--cast-inputs")
    assert ranks[0]["weights"] == ["torch.bfloat16"]
    with pytest.raises(AssertionError):
        _assert_inputs_kept(ranks[0])


def test_the_policy_casts_no_forward_input():
    for bf16 in (False, True):
        policy = mixed_precision(bf16)
        assert policy.cast_forward_inputs is False
        assert policy.param_dtype == (torch.bfloat16 if bf16 else None)
        assert policy.reduce_dtype == (torch.float32 if bf16 else None)


# ----------------------------------------------------------------------------- one process

MODEL = ModelConfig(d_model=32, n_layers=3, n_heads=4)


def _val(n_rows: int, rows: int) -> list:
    import numpy as np

    rng = np.random.default_rng(1)
    docs = [(rng.integers(3, 50, size=rng.integers(2, 30)), 0) for _ in range(40 * n_rows)]
    return list(batches(list(pack_documents(docs, 17, 1, 2, 0))[:n_rows], rows))


def test_one_process_checkpoints_and_compiles_each_block_whole_graph(monkeypatch):
    """Checkpointing is switched on, each block (not the model) is compiled in place,
    whole-graph and static; no wrapper: the module is the model."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    model = GPT(MODEL, 50)
    cfg = TrainConfig(compile=True, activation_checkpointing=True)
    assert parallelize(model, World(), cfg) is model
    assert model.checkpoint_blocks
    assert calls == [{"dynamic": False, "fullgraph": True}] * MODEL.n_layers
    assert [b._compiled_call_impl is not None for b in model.blocks] == [True] * 3
    assert model._compiled_call_impl is None


def test_a_trainer_refuses_to_shard_a_model_whose_optimizer_exists():
    """FSDP replaces the parameters: a model to shard must be sharded before its
    optimizer is built, so a trainer given an unsharded model in a sharded world and no
    engine refuses instead of training parameters the optimizer does not hold."""
    model = GPT(MODEL, 50)
    cfg = TrainConfig()
    world = dataclasses.replace(World(), parallel="fsdp")
    with pytest.raises(ValueError, match="before its optimizer is built"):
        Trainer(model, build_optimizer(model, cfg), cfg, iter([]), "isolated", world=world)


def test_a_model_on_meta_is_given_its_weights_after_the_step():
    torch.manual_seed(0)
    eager = GPT(MODEL, 50)
    torch.manual_seed(0)
    model = GPT(MODEL, 50, device="meta")
    parallelize(model, World(), TrainConfig())
    assert model.embed.weight.device.type == "cpu"
    for (name, a), b in zip(model.state_dict().items(), eager.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_padding_the_last_batch_changes_no_score():
    val = _val(6, 4)
    assert [b.input_ids.shape[0] for b in val] == [4, 2]  # a smaller last batch
    padded = pad_rows(val, 4)
    assert [b.input_ids.shape[0] for b in padded] == [4, 4]
    assert pad_rows(padded, 4) == padded
    torch.manual_seed(0)
    model = GPT(MODEL, 50)
    expected = evaluate(model, val, "isolated", ["d"])
    got = evaluate(model, padded, "isolated", ["d"])
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name
