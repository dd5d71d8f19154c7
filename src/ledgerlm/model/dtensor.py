"""DTensor helpers: whether a parameter is sharded (by FSDP), and initial weights copied
into a parameter or its shard."""

from __future__ import annotations

import sys

import torch


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor (a parameter sharded by FSDP). Asked without importing
    ``torch.distributed.tensor`` (half a second): no DTensor exists until it is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def assign_full(p: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a whole initial tensor into ``p``, or into its shard when ``p`` is sharded."""
    if is_sharded(p):
        from torch.distributed.tensor import distribute_tensor

        local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
        p.to_local().copy_(local.to_local())
    else:
        p.copy_(full)


def local_data(p: torch.Tensor) -> torch.Tensor:
    """A parameter's data on this rank (its shard when it is sharded)."""
    p = p.detach()
    return p.to_local() if hasattr(p, "to_local") else p
