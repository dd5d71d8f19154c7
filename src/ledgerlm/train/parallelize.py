"""The one parallelize step (torchtitan's idiom): what turns a built ``GPT`` into what
the training step calls, applied once and in this order:

1. activation checkpointing (``train.activation_checkpointing``): each block's
   activations are recomputed in the backward pass (``GPT.checkpoint_blocks``);
2. compile (``train.compile``): each transformer block in place, ``fullgraph=True``
   and static shapes, *before* sharding, so FSDP's gathers stay between the compiled
   blocks (the blocks share one graph: one compile for all of them, not one each);
3. FSDP2 (``fully_shard`` per block, then the root; ``train.parallel = "fsdp"``), then
   the weights (a model still on the ``meta`` device is materialized only now, each
   rank its shards), then the DDP wrap (``"ddp"``), which needs whole weights.

Build the optimizer afterwards: sharding replaces the parameters. The lab calls
``parallelize`` once (``lab/build.py``) and hands its engine to the ``Trainer``; a
``Trainer`` given none (a library caller, one process or DDP) calls it itself, and
calls a model its caller sharded already as it is.

Compiled shapes are static (``micro_batch_rows`` x ``seq_len``): the lab pads a
compiled run's last, smaller validation batch to the full rows (``pad_rows``), so
evaluation compiles its (gradient-free) graph once and never again. Past torch's
recompile limit a compiled function runs eagerly without a word, which is why no shape
may vary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ledgerlm.config import TrainConfig
from ledgerlm.tokens.packing import Batch
from ledgerlm.train.distributed import World


def mixed_precision(bf16_params: bool) -> Any:
    """FSDP2's policy: parameters gathered in bf16 and gradients reduced in fp32
    (``bf16_params``), or both as stored. Forward inputs are never cast (``cast_forward_inputs``
    off): the loss's fp64 weights (sequence-mean 1/n would be rounded by up to 2**-9 in
    bf16) and the fp32 RoPE tables reach the model as they are; the layers compute in
    their parameters' dtype anyway, the rotation rounds to its input's."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not bf16_params:
        return MixedPrecisionPolicy(cast_forward_inputs=False)
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
    )


def shard_model(model: torch.nn.Module, world: World, bf16_params: bool = False) -> None:
    """Shard ``model`` over the ranks in place with FSDP2 (``fully_shard``): each
    transformer block (``model.blocks``) is one unit, the rest (embedding, final norm,
    head) the root's, all under ``mixed_precision(bf16_params)``.

    Gradients are reduce-scattered with SUM (a divide factor of 1: the loss already
    carries the global denominator). On a model still on the ``meta`` device this
    spends no memory; ``GPT.materialize`` then gives each rank its shards. Does nothing
    unless the world is sharded.
    """
    if not world.sharded:
        return
    from torch.distributed.fsdp import FSDPModule, fully_shard

    policy = mixed_precision(bf16_params)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=world.mesh, mp_policy=policy)
    fully_shard(model, mesh=world.mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM


def compile_blocks(model: torch.nn.Module) -> None:
    """Compile each transformer block in place (``nn.Module.compile``, not a wrapper:
    parameter names, and so optimizer groups, checkpoints and weight hashes, stay the
    eager model's), whole-graph and with static shapes."""
    for block in getattr(model, "blocks", []):
        block.compile(dynamic=False, fullgraph=True)


# No annotations: DDP refuses a hook whose annotations are not its own classes, and this
# module's annotations are strings (``from __future__ import annotations``).
def _sum_gradients(group, bucket):
    """DDP communication hook: all-reduce a gradient bucket with SUM (DDP's own hook
    divides by the world size, which would turn the global objective into a mean)."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def data_parallel(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """The module the training step calls: ``model`` itself in one process or when it
    is sharded (FSDP's own hooks gather and reduce), else DDP around it, set to sum
    gradients over ranks."""
    if world.parallel in ("none", "fsdp"):
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [world.device.index] if world.device.type == "cuda" else None
    engine = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
    engine.register_comm_hook(None, _sum_gradients)
    return engine


def _on_meta(model: torch.nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def parallelize(
    model: torch.nn.Module,
    world: World,
    train: TrainConfig,
    bf16_params: bool | None = None,
) -> torch.nn.Module:
    """Checkpointing, compile, sharding or DDP for ``model`` (see the module doc), in
    place; returns the engine the training step calls: ``model`` itself, or DDP
    around it, set to sum gradients over ranks.

    ``bf16_params`` (default: ``train.precision = "bf16"`` on CUDA) gathers FSDP's
    parameters in bf16. A ``model`` on the ``meta`` device is given its weights on
    ``world.device`` after sharding (``materialize``).
    """
    if train.activation_checkpointing:
        model.checkpoint_blocks = True
    if train.compile:
        compile_blocks(model)
    if bf16_params is None:
        bf16_params = train.precision == "bf16" and world.device.type == "cuda"
    shard_model(model, world, bf16_params)
    if _on_meta(model):
        model.materialize(world.device)  # type: ignore[operator]
    return data_parallel(model, world)


def pad_rows(batches: list[Batch], rows: int) -> list[Batch]:
    """``batches`` with the last one padded to ``rows`` rows, so every batch has the
    compiled shape: the padding rows hold no real token and no target (segment -1, no
    loss), so they change no score."""
    if not batches or batches[-1].input_ids.shape[0] >= rows:
        return batches
    last = batches[-1]
    extra = rows - last.input_ids.shape[0]
    fill = {
        "input_ids": 0,
        "targets": 0,
        "doc_ids": -1,
        "position_ids": 0,
        "loss_mask": False,
        "valid": False,
        "target_domains": -1,
    }
    padded = {}
    for name, value in fill.items():
        t = getattr(last, name)
        pad = torch.full((extra, *t.shape[1:]), value, dtype=t.dtype, device=t.device)
        padded[name] = torch.cat([t, pad])
    return [*batches[:-1], Batch(**padded)]
