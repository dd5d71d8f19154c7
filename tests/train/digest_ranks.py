"""The snapshot digest of a model sharded by FSDP2 over the ranks of ``torchrun``.

Run by tests/train/test_weights_digest.py (``torchrun --nproc-per-node 2``); each rank
writes the digests it computed and how many whole tensors it gathered for them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ledgerlm.config import ModelConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.train.distributed import distributed_world
from ledgerlm.train.evaluate import weights_digest

CFG = ModelConfig(d_model=16, n_layers=2, n_heads=2)
VOCAB = 40


def sharded(world, seed: int) -> GPT:
    """The model of ``seed`` sharded as the lab shards it: each block, then the root."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = GPT(CFG, VOCAB)
    for block in model.blocks:
        fully_shard(block, mesh=world.mesh)
    fully_shard(model, mesh=world.mesh)
    return model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with distributed_world() as world:
        world = world.placed("cpu", "fsdp")
        from torch.distributed.tensor import DTensor

        gathers = []
        full_tensor = DTensor.full_tensor
        DTensor.full_tensor = lambda self, **kw: gathers.append(1) or full_tensor(self, **kw)
        model = sharded(world, 0)
        record = {
            "digest": weights_digest(model),
            "again": weights_digest(sharded(world, 0)),  # the same weights, built anew
            "other": weights_digest(sharded(world, 1)),
            "gathers": len(gathers),
        }
        # one element of rank 1's shard of the last block's down projection changed
        shard = model.blocks[-1].mlp.w_down.weight.to_local()
        with torch.no_grad():
            if world.rank == 1:
                shard.view(-1)[0] += 1.0
        record["rank1_changed"] = weights_digest(model)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{world.rank}.json").write_text(json.dumps(record))
        del model


if __name__ == "__main__":
    main()
