"""A weights snapshot: its digest (which names the exact weights an evaluation scored),
swapping a kept copy of it into the model, and freeing the weights FSDP gathered for
forwards that no backward follows (an evaluation's)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ledgerlm.model.dtensor import is_sharded, local_data


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: names the exact snapshot an evaluation scored.

    No rank gathers the model for it: a whole (replicated) tensor is hashed as it is,
    and the shards of a sharded model (FSDP) are hashed where they lie, each rank its
    own, the ranks' small digests then all-gathered and hashed in rank order
    (``_shards_digest``). Identical weights on the same number of ranks give the same
    digest; a sharded model's depends on its sharding, so an FSDP run on 2 ranks and
    the same weights in one process (or on 4 ranks) give different digests. Digests
    are compared only within a run and its resumes, and across rank counts only for
    replicas (DDP and one process), which hash whole tensors alike.
    """
    h = hashlib.sha256()
    shards = None
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach()
        if is_sharded(tensor):  # this rank's shard; the others' come by their digests
            shards = shards or ([], tensor.device_mesh)
            shards[0].append((name, tensor.to_local()))
            continue
        h.update(name.encode())
        h.update(tensor.cpu().contiguous().numpy().tobytes())
    if shards is not None:
        h.update(_shards_digest(*shards))
    return h.hexdigest()[:16]


def _shards_digest(local: list[tuple[str, torch.Tensor]], mesh: Any) -> bytes:
    """This rank's shards hashed (names, shapes and bytes), every rank's digest
    all-gathered over ``mesh`` (32 bytes each) and joined in rank order."""
    import torch.distributed as dist

    h = hashlib.sha256()
    for name, shard in local:
        h.update(f"{name}:{tuple(shard.shape)}".encode())
        h.update(shard.cpu().contiguous().numpy().tobytes())
    mine = torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8).to(mesh.device_type)
    every = [torch.empty_like(mine) for _ in range(mesh.size())]
    dist.all_gather(every, mine, group=mesh.get_group())
    return b"".join(bytes(d.cpu().tolist()) for d in every)


@contextmanager
def swapped(model: torch.nn.Module, weights: list[torch.Tensor]) -> Iterator[None]:
    """``model`` with ``weights`` (its parameters' local data, in order) in place of its
    own for the length of the block; its own are put back bitwise."""
    params = [local_data(p) for p in model.parameters()]
    own = [p.clone() for p in params]
    with torch.no_grad():
        for p, w in zip(params, weights, strict=True):
            p.copy_(w)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, w in zip(params, own, strict=True):
                p.copy_(w)


def reshard(model: torch.nn.Module) -> None:
    """Free the weights FSDP2 gathered for forwards without a backward (an evaluation).

    The root module (embedding, tied head, final norm) keeps its gathered weights after
    a forward, for the backward that would follow; after an evaluation none follows, so
    the next training forward would run with them (a swapped-in snapshot's, under
    asynchronous evaluation), and until then ``parameters()`` yields them whole, where
    ``swapped`` puts a snapshot's shards (the last pieces, scored at once)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
