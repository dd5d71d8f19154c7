"""Data parallelism across processes started by ``torchrun``, with global denominators.

Every rank holds the whole model and trains on its own micro-batches. The step's
loss is sum over all ranks and micro-batches of the per-target losses divided by
the *global* count of supervised targets, so

- the counts (targets, denominator, tokens, rows) are all-reduced before any
  forward, and each micro-batch backpropagates numerator / global denominator;
- gradients are all-reduced with SUM (not averaged): each rank's gradient is
  already its share of the global objective.

An uneven number of targets across ranks therefore weighs every target equally,
which averaging per-rank means (what a plain DDP wrapper over a per-rank mean
loss does) would not. A rank whose micro-batches hold no target contributes
zeros. The ranks apply identical updates, so their weights stay bitwise equal.

On one process every collective is the identity; nothing here needs a GPU (gloo
on CPU, nccl on CUDA).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """The rank that writes the ledger, checkpoints and progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def all_reduce(self, values: Sequence[float], dtype: torch.dtype) -> list[float]:
        """Sum of ``values`` over all ranks (one collective for the whole list); on one
        process the values themselves, with no tensor round trip on the step's path."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(list(values), dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def all_reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks in one flat buffer; a missing gradient counts as zero."""
        if not self.distributed:
            return
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def init_world() -> World:
    """The world ``torchrun`` describes in the environment, or a single process.

    Starts the process group once (gloo on CPU, nccl when CUDA is present).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return World(dist.get_rank(), dist.get_world_size())


def shutdown_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


class RankShard(Iterator[T]):
    """Every ``size``-th item of a global stream, starting at ``rank``.

    Each rank walks the same global stream (same seed, same cursor), so after a
    step every rank stands at the same global position and one saved cursor
    resumes them all. Packing the other ranks' rows costs a little CPU per rank;
    the model's forward and backward, which dominate, are never repeated.
    """

    def __init__(self, stream: Iterator[T], world: World) -> None:
        self.stream, self.world = stream, world

    def __iter__(self) -> RankShard[T]:
        return self

    def __next__(self) -> T:
        mine = None
        for r in range(self.world.size):
            item = next(self.stream)
            if r == self.world.rank:
                mine = item
        return mine  # type: ignore[return-value]

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()  # type: ignore[attr-defined]


@contextmanager
def distributed_world() -> Iterator[World]:
    """``init_world()`` for the length of a command, then the process group is closed."""
    world = init_world()
    try:
        yield world
    finally:
        shutdown_world(world)
