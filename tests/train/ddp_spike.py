"""``--steps`` attempts at an update on a learnable stream where one rank's micro-batch
of attempt ``--spike-at`` is random tokens, under ``train.on_spike = "skip"``; run as one
rank of torchrun (or plain ``python``: one process, the ranks' micro-batches accumulated).

Run by tests/train/test_distributed.py; each rank writes the updates it skipped, its
spike events, its own loss on each of its micro-batches and its final weights.
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
from ledgerlm.tokens.packing import Batch, make_batch
from ledgerlm.train.distributed import RankShard, World, distributed_world
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer

RANKS, ROWS, LEN, VOCAB = 2, 2, 17, 40


def global_stream(steps: int, spike_at: int) -> list[Batch]:
    """``RANKS`` micro-batches per update: one short pattern repeated (the model learns
    it in a few updates), except the last rank's share of update ``spike_at``."""
    pattern = np.tile(np.arange(3, 11), 3)[:LEN]
    rng = np.random.default_rng(0)
    out = []
    for step in range(1, steps + 1):
        for rank in range(RANKS):
            garbage = step == spike_at and rank == RANKS - 1
            rows = rng.integers(3, VOCAB, (ROWS, LEN)) if garbage else np.tile(pattern, (ROWS, 1))
            segs = np.zeros((ROWS, LEN), np.int64)
            out.append(make_batch(rows, segs, np.ones((ROWS, LEN), bool)))
    return out


def _run(args: argparse.Namespace, world: World) -> None:
    """The step (or steps) and what each rank writes; its engine and trainer are
    released when it returns, before the process group closes."""
    world = world.placed("cpu", "ddp" if world.distributed else "none")
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), VOCAB).double()
    own: list[float] = []  # this rank's loss on each of its micro-batches
    targets = ROWS * (LEN - 1)
    model.register_forward_hook(lambda m, i, out: own.append(float(out.detach()) / targets))
    cfg = TrainConfig(
        micro_batch_rows=ROWS,
        grad_accum=RANKS // world.size,
        lr=5e-2,
        warmup_steps=0,
        schedule="constant",
        spike_warmup=5,
        on_spike="skip",
    )
    data = global_stream(args.steps, args.spike_at)
    trainer = Trainer(
        model,
        build_optimizer(model, cfg),
        cfg,
        RankShard(iter(data), world),
        "isolated",
        world=world,
    )
    # A fixed number of attempts, skipped or not: ranks that disagreed on a skip
    # still run the same collectives, and end with different weights, not a hang.
    for _ in range(args.steps):
        trainer.train_step()
    record = {
        "skipped": [r.step for r in trainer.state.history if r.skipped],
        "attempts": [r.step for r in trainer.state.history],
        "skipped_updates": trainer.state.skipped_steps,
        "events": trainer.events,
        "losses": [r.loss for r in trainer.state.history],
        "own_losses": own,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{world.rank}.json").write_text(json.dumps(record))
    tensors = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(args.out / f"rank{world.rank}.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--spike-at", type=int, default=12)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with distributed_world() as world:
        _run(args, world)


if __name__ == "__main__":
    main()
