"""One sequence-mean training update through FSDP2 with bf16 parameters, as one rank of
torchrun (gloo on CPU), built as the lab builds it: ``parallelize`` on a ``meta`` model.

Run by tests/train/test_parallelize.py. Each rank writes the mixed-precision policy of
every FSDP module and the dtypes the model saw inside its forward: the loss weights
at the head, the RoPE tables and the hidden states at each block.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.model import gpt
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train import parallelize as parallel
from ledgerlm.train.distributed import RankShard, distributed_world
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer


def _seen() -> dict[str, set[str]]:
    """Record the dtypes reaching the head's loss and each block (a spy around the real
    functions: what they compute is unchanged)."""
    seen: dict[str, set[str]] = {"weights": set(), "rope": set(), "hidden": set()}
    head_loss, block = gpt.head_loss, gpt.Block.forward

    def spy_head(x, weight, targets, weights):
        seen["weights"].add(str(weights.dtype))
        return head_loss(x, weight, targets, weights)

    def spy_block(self, x, rope, mask):
        seen["rope"].add(str(rope[0].dtype))
        seen["hidden"].add(str(x.dtype))
        return block(self, x, rope, mask)

    gpt.head_loss, gpt.Block.forward = spy_head, spy_block
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--cast-inputs", action="store_true", help="the policy that cast them")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cast_inputs:  # FSDP's default, which cast the loss weights to bf16
        from torch.distributed.fsdp import MixedPrecisionPolicy

        parallel.mixed_precision = lambda bf16: MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    seen = _seen()
    with distributed_world() as world:
        world = world.placed("cpu", "fsdp")
        torch.manual_seed(0)
        model = GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2), 40, device="meta")
        cfg = TrainConfig(max_steps=1, micro_batch_rows=2, objective="sequence_mean")
        engine = parallel.parallelize(model, world, cfg, bf16_params=True)
        rng = np.random.default_rng(0)
        docs = [(rng.integers(3, 40, size=rng.integers(2, 20)), 0) for _ in range(30)]
        stream = RankShard(iter(batches(list(pack_documents(docs, 17, 1, 2, 0)), 2)), world)
        optimizer = build_optimizer(model, cfg)
        assert engine is model  # FSDP's hooks are the model's own
        # no engine passed: the trainer calls a model sharded by its caller as it is
        trainer = Trainer(model, optimizer, cfg, stream, "isolated", world=world)
        loss = trainer.train_step()
        from torch.distributed.fsdp import FSDPModule

        policies = []
        for name, module in model.named_modules():
            if isinstance(module, FSDPModule):
                p = module._get_fsdp_state()._mp_policy
                policies.append(
                    {
                        "module": name,
                        "param_dtype": str(p.param_dtype),
                        "reduce_dtype": str(p.reduce_dtype),
                        "cast_forward_inputs": p.cast_forward_inputs,
                    }
                )
        record = {
            "loss": loss,
            "policies": policies,
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            **{k: sorted(v) for k, v in seen.items()},
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"rank{world.rank}.json").write_text(json.dumps(record))
        del trainer, engine, model, optimizer


if __name__ == "__main__":
    main()
