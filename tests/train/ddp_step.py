"""One optimizer step on ragged packed rows, in one process or as one rank of torchrun.

Run by tests/train/test_distributed.py (``torchrun --nproc-per-node 2`` and plain
``python``); each rank writes its loss, counts, gradients and updated weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.checkpoint import load_checkpoint, save_checkpoint
from ledgerlm.train.distributed import RankShard, World, distributed_world
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.parallelize import parallelize


def ragged_rows() -> list:
    """8 rows: 6 packed full rows, one mostly padding, one without any target."""
    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, 40, size=rng.integers(1, 30)), 0) for _ in range(40)]
    rows = list(pack_documents(docs, 17, 1, 2, 0))[:6]
    rows += list(pack_documents([(np.array([7, 8, 9]), 1)], 17, 1, 2, 0))
    lone = np.zeros(17, np.int64)
    lone[0] = 1
    rows.append((lone, np.where(lone == 1, 0, -1), np.where(lone == 1, 1, -1), lone == 1))
    assert len(rows) == 8
    return rows


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from the ranks' shards when it is sharded."""
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run(args: argparse.Namespace, world: World) -> None:
    """The step (or steps) and what each rank writes; its engine and trainer are
    released when it returns, before the process group closes."""
    world = world.placed("cpu", args.parallel)
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2), 40).double()
    if args.skew and world.rank == 1:  # a wrong share: a test's tolerance must see it
        forward = model.forward
        model.forward = lambda *a, **kw: forward(*a, **kw) * (1 + args.skew)
    # At each micro-batch's forward: has a sharded parameter (a block's; the root's are
    # unsharded inside its forward) received a reduced gradient yet?
    grads_seen: list[bool] = []
    counted = model.forward

    def forward_seeing_grads(*a, **kw):
        sharded = [p for p in model.parameters() if hasattr(p, "full_tensor")]
        grads_seen.append(any(p.grad is not None for p in sharded))
        return counted(*a, **kw)

    model.forward = forward_seeing_grads
    cfg = TrainConfig(
        max_steps=1,
        grad_accum=args.accum,
        micro_batch_rows=args.rows,
        grad_clip=0,
        objective=args.objective,
        empty_rows=args.empty_rows,
    )
    stream = RankShard(iter(batches(ragged_rows(), args.rows)), world)
    engine = parallelize(model, world, cfg)  # FSDP2 or DDP, as the lab does
    optimizer = build_optimizer(model, cfg)
    if args.init_from:
        load_checkpoint(args.init_from, model, optimizer)
    trainer = Trainer(model, optimizer, cfg, stream, "isolated", world=world, engine=engine)
    loss = trainer.train_step()
    if args.save:
        save_checkpoint(args.save, model, {"step": 1}, optimizer, world)
    tensors = {}
    for name, p in model.named_parameters():
        tensors[f"grad/{name}"] = _full(p.grad).clone().contiguous()
        tensors[f"param/{name}"] = _full(p).clone().contiguous()
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / f"rank{world.rank}.safetensors"))
    s = trainer.state
    record = {
        "loss": loss,
        "targets": s.step_targets,
        "tokens": s.step_tokens,
        "denominator": s.denominator,
        "rows": s.rows,
        "world": world.size,
        "grads_seen": grads_seen,
        "local_targets": sum(
            b.num_targets for b in list(batches(ragged_rows(), args.rows))[world.rank :: world.size]
        ),
    }
    (args.out / f"rank{world.rank}.json").write_text(json.dumps(record))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--accum", type=int, required=True)
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--objective", default="token_mean")
    ap.add_argument("--empty-rows", default="exclude")
    ap.add_argument("--parallel", default="auto")
    ap.add_argument("--init-from", type=Path, help="load weights and optimizer state first")
    ap.add_argument("--save", type=Path, help="save a checkpoint after the step")
    ap.add_argument(
        "--skew", type=float, default=0.0, help="scale rank 1's loss numerators by 1 + SKEW"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    with distributed_world() as world:
        _run(args, world)


if __name__ == "__main__":
    main()
