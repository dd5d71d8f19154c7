"""One rank of ``torchrun --nproc-per-node 2``: load a one-process checkpoint into an
FSDP2 model (gloo, CPU) and write what this rank read from the checkpoint's tensor
files, its whole weights and optimizer state, and its next random draws.

Run by tests/train/test_sharded_load.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.train import checkpoint
from ledgerlm.train.distributed import distributed_world
from ledgerlm.train.optim import build_optimizer

CFG = ModelConfig(d_model=16, n_layers=2, n_heads=2)
VOCAB = 40


def _full(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def main(folder: Path, out: Path) -> None:
    with distributed_world() as world:
        world = world.placed("cpu", "fsdp")
        torch.manual_seed(100 + world.rank)  # weights unlike the checkpoint's
        model = GPT(CFG, VOCAB)
        for block in model.blocks:
            fully_shard(block, mesh=world.mesh)
        fully_shard(model, mesh=world.mesh)
        optimizer = build_optimizer(model, TrainConfig())
        read: list[str] = []
        real = checkpoint.load_file

        def spy(path: str, *args, **kwargs):
            read.append(Path(path).name)
            return real(path, *args, **kwargs)

        checkpoint.load_file = spy
        out.mkdir(parents=True, exist_ok=True)
        try:
            checkpoint.load_checkpoint(folder, model, optimizer, restore_rng=True)
        except ValueError as exc:  # every rank must say it, none wait for another
            (out / f"rank{world.rank}.json").write_text(json.dumps({"error": str(exc)}))
            del model, optimizer
            return
        names = {id(p): n for n, p in model.named_parameters()}
        tensors = {f"weight/{n}": _full(p) for n, p in model.named_parameters()}
        for p, st in optimizer.state.items():
            for key in ("exp_avg", "exp_avg_sq"):
                tensors[f"{key}/{names[id(p)]}"] = _full(st[key])
        steps = sorted({float(st["step"]) for st in optimizer.state.values()})
        draws = torch.rand(4).tolist()
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, str(out / f"rank{world.rank}.st")
        )
        meta = {"read": read, "steps": steps, "draws": draws}
        (out / f"rank{world.rank}.json").write_text(json.dumps(meta))
        del model, optimizer


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
