"""Where training runs: the ``World`` (device, ranks, backend, the data-parallel engine),
and data parallelism across processes started by ``torchrun`` with global denominators.

The step's loss is sum over all ranks and micro-batches of the per-target losses
divided by the *global* count of supervised targets, so

- the counts (targets, denominator, tokens, rows) are all-reduced before any
  forward, and each micro-batch backpropagates numerator / global denominator;
- gradients are summed over ranks (not averaged): each rank's gradient is already
  its share of the global objective. PyTorch's own engine does the summing, its
  communication overlapping the backward pass: FSDP2 (``fully_shard`` per block,
  gradient divide factor 1; ``train.parallel = "fsdp"``, the default) or
  ``DistributedDataParallel`` with a summing communication hook (``"ddp"``), both
  applied by the one parallelize step (``train/parallelize.py``).

An uneven number of targets across ranks therefore weighs every target equally,
which averaging per-rank means (what a plain DDP wrapper over a per-rank mean
loss does) would not. A rank whose micro-batch holds no target still runs its
forward and backward (a zero numerator): the engine's collectives must run equally
often on every rank. The ranks apply identical updates, so their weights stay
bitwise equal.

The process group serves CPU tensors with gloo and, where CUDA is present, CUDA
tensors with NCCL (``cpu:gloo,cuda:nccl``), so the device a recipe asks for can be
chosen after the group exists (a resumed run reads its recipe from rank 0). On one
process every collective is the identity.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place: its rank among the data-parallel ranks, its device, and the
    engine that sums gradients over ranks. Built once from the environment
    (``init_world``) and placed by the recipe (``placed``); the training loop asks it,
    never ``torch.cuda``, where tensors go."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    parallel: str = "none"  # "none" | "ddp" | "fsdp"
    mesh: Any = field(default=None, compare=False)  # the 1-D DeviceMesh of the ranks (fsdp)
    timeout: float | None = None  # seconds a collective waits once training starts

    @property
    def is_main(self) -> bool:
        """The rank that writes the ledger, checkpoints and progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def placed(
        self, device: str = "auto", parallel: str = "auto", timeout: float | None = None
    ) -> World:
        """This world on the device and engine a recipe asks for (``train.device``,
        ``train.parallel``): ``auto`` is CUDA when present, and FSDP under torchrun
        (``none`` in one process, where any engine is ``none``). ``timeout``
        (``train.collective_timeout``): how long each collective waits for the other
        ranks once they all train (``start_together``)."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("train.device = 'cuda', but no CUDA device is available")
            where = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(where)
        elif device == "cpu":
            where = torch.device("cpu")
        else:
            raise ValueError(f"train.device = {device!r}: choose auto, cpu or cuda")
        if parallel == "auto" or not self.distributed:  # one rank has nothing to share
            parallel = "fsdp" if self.distributed else "none"
        if parallel not in ("none", "ddp", "fsdp"):
            raise ValueError(f"train.parallel = {parallel!r}: choose auto, fsdp, ddp or none")
        if parallel == "none" and self.distributed:
            raise ValueError(
                f"train.parallel = 'none' trains in one process, but torchrun started "
                f"{self.size}; use 'fsdp' or 'ddp' (or 'auto')"
            )
        mesh = self.mesh
        if parallel == "fsdp" and mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(where.type, (self.size,))
        timeout = self.timeout if timeout is None else timeout
        return dataclasses.replace(
            self, device=where, parallel=parallel, mesh=mesh, timeout=timeout
        )

    @property
    def sharded(self) -> bool:
        """Parameters, gradients and optimizer state are split over the ranks (FSDP)."""
        return self.parallel == "fsdp"

    def to_device(self, batch: Any) -> Any:
        """A batch (anything with ``.to(device, non_blocking)``) on this world's device;
        on CUDA the host copy is pinned first so the transfer does not block."""
        if self.device.type == "cpu":
            return batch
        return batch.to(self.device, pin=True)

    def all_reduce(self, values: Sequence[float], dtype: torch.dtype) -> list[float]:
        """Sum of ``values`` over all ranks (one collective for the whole list); on one
        process the values themselves, with no tensor round trip on the step's path."""
        if not self.distributed:
            return list(values)
        t = torch.tensor(list(values), dtype=dtype)  # CPU: gloo, whatever the device
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def start_together(self) -> None:
        """Wait until every rank is ready to train (under the group's first timeout: a
        rank may still be building its model), then bound each later collective by
        ``timeout``, so a rank that exits or hangs stops the others in that time."""
        if self.distributed:
            self.barrier()
            if self.timeout is not None:
                _set_timeout(self.timeout, self.mesh)


def init_world() -> World:
    """The world ``torchrun`` describes in the environment, or a single process.

    Starts the process group once: gloo for CPU tensors and, where CUDA is present,
    NCCL for CUDA tensors.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return World(dist.get_rank(), dist.get_world_size(), local_rank)


def one_process() -> World:
    """The world of a caller that trains in one process (a search's proxy runs, a sweep's
    points, a library call given no world). Under torchrun every rank would run all of
    it on the same workspace, racing the others for its runs: refused."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size > 1:
        raise ValueError(
            f"torchrun started {size} processes, but this command trains in one (each "
            "would run all of it on the same workspace): run it without torchrun; "
            "ledgerlm run, train and resume train on several ranks"
        )
    return World()


def shutdown_world(world: World) -> None:
    """Close the process group. Unreachable objects that still hold it (an engine's
    reducer, a pending collective's work and its tensors) are freed first, while the
    group and the interpreter are whole: gloo aborts a process that frees them after
    the group's shutdown or during interpreter exit."""
    if world.distributed and dist.is_initialized():
        gc.collect()
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
        # the documents of every rank's item of the last step, when the stream names them:
        # each rank can say what data the whole update saw
        self.last_documents: list[Any] = []

    def __iter__(self) -> RankShard[T]:
        return self

    def __next__(self) -> T:
        mine = None
        placed: list[Any] = []
        for r in range(self.world.size):
            item = next(self.stream)
            placed += getattr(self.stream, "last_documents", ())
            if r == self.world.rank:
                mine = item
        self.last_documents = placed
        return mine  # type: ignore[return-value]

    def describe_documents(self, placed: Any) -> dict[str, Any]:
        """The global stream's names for ``placed`` ({} for a stream without them)."""
        describe = getattr(self.stream, "describe_documents", None)
        return describe(placed) if describe is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()  # type: ignore[attr-defined]

    def reweight(self, weights: Any) -> None:
        """Change the global stream's mixture weights (every rank does the same)."""
        self.stream.reweight(weights)  # type: ignore[attr-defined]

    def consumed_by_domain(self) -> dict[str, int]:
        """Tokens of the global stream per domain: every rank's, since each rank walks it
        ({} for a stream that does not count them)."""
        counts = getattr(self.stream, "consumed_by_domain", None)
        return counts() if counts is not None else {}


@contextmanager
def distributed_world() -> Iterator[World]:
    """``init_world()`` for the length of a command, then the process group is closed;
    a collective that lost a rank ends it as a ``PeerLostError`` (``watching_peers``)."""
    world = init_world()
    try:
        with watching_peers(world):
            yield world
            # Every rank reaches the end before the group goes: a rank tearing it down
            # while another still finishes its last collective can abort that rank.
            world.barrier()
    finally:
        shutdown_world(world)


# -- a rank that stops answering -------------------------------------------------------
# The process group starts with torch's own timeout (30 minutes for gloo), which bounds
# the other ranks' wait for rank 0 to prepare the data and tokens and every rank's setup;
# once all ranks train (``World.start_together``), each collective waits
# ``train.collective_timeout`` seconds.
_timeout: list[float] = []  # the timeout in force since then (the group is the process's)

# How gloo says that a collective lost its peer: it waited past the timeout, or the
# peer's connection closed (the peer exited, was killed, or its machine went away).
_TIMED_OUT = ("timed out",)
_GONE = ("connection closed", "connection reset", "broken pipe", "read error", "write error")


class PeerLostError(ConnectionError):
    """A collective could not complete: another rank exited or stopped answering within
    ``train.collective_timeout``. The run cannot go on without it; the message is one
    line naming this rank and the other."""


def _set_timeout(seconds: float, mesh: Any) -> None:
    """Every later collective of the default group (and of the mesh's, when it has its
    own) waits ``seconds`` for the other ranks."""
    from datetime import timedelta

    from torch.distributed import distributed_c10d as c10d

    set_timeout = getattr(c10d, "_set_pg_timeout", None)
    if set_timeout is None:  # pragma: no cover - a torch without it keeps its default
        return
    groups = [c10d._get_default_group()]
    if mesh is not None and mesh.get_group() not in groups:
        groups.append(mesh.get_group())
    for group in groups:
        set_timeout(timedelta(seconds=seconds), group)
    _timeout[:] = [seconds]


def _messages(exc: BaseException) -> Iterator[str]:
    """The texts of ``exc`` and of the errors it was raised from or while handling (DCP
    and autograd wrap the collective's own error)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield str(e)
        todo += [e.__cause__, e.__context__]


def peer_lost(exc: BaseException, world: World) -> PeerLostError | None:
    """``exc`` as the one line a lost rank deserves, or None when it is not a collective
    that lost a rank (or this is one process)."""
    if isinstance(exc, PeerLostError):
        return exc
    # torch.distributed raises RuntimeErrors (DistError among them), DCP a
    # CheckpointException holding each rank's error; anything else is not a collective's
    collective = isinstance(exc, RuntimeError) or type(exc).__name__ == "CheckpointException"
    if not world.distributed or not collective:
        return None
    text = " ".join(_messages(exc)).lower()
    other = f"rank {1 - world.rank}" if world.size == 2 else "another rank"
    if any(words in text for words in _TIMED_OUT):
        waited = f"{_timeout[0]:g} s, train.collective_timeout" if _timeout else "its timeout"
        return PeerLostError(
            f"rank {world.rank}: {other} stopped answering (a collective waited {waited})"
        )
    gone = next((word for word in _GONE if word in text), None)
    if gone is not None:
        return PeerLostError(f"rank {world.rank}: {other} exited ({gone} in a collective)")
    return None


@contextmanager
def watching_peers(world: World) -> Iterator[None]:
    """A collective that failed because another rank exited or stopped answering is
    raised as a ``PeerLostError`` (one line, not gloo's traceback); other errors pass."""
    try:
        yield
    except BaseException as exc:
        lost = peer_lost(exc, world)
        if lost is None or lost is exc:
            raise
        raise lost from None
