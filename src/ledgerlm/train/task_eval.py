"""The run's downstream tasks, scored by the evaluator on the snapshot each validation
loss scored (``EvalCallback``).

The task files are resolved once per run by rank 0 (``lab.tasks.resolve_tasks``, in the
``eval`` phase that builds the validation set); the other ranks get rank 0's items
from it when training starts (``Tasks.shared``), so every rank scores the very items
rank 0 recorded in the ledger, whatever happened to the files since. Under
``torchrun`` the items are split over the ranks and their scores summed
(``ranks_of``: the ``tasks.score.Ranks`` of a ``World``), so every rank gets the
metrics one process would. Exact tasks generate with the KV cache, which runs on the
plain ``GPT`` (``decode.Decoder``); a sharded model has none (``check_sharded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ledgerlm.config import TaskConfig
from ledgerlm.tasks.items import TaskSet
from ledgerlm.tasks.score import Ranks, score_tasks
from ledgerlm.train.distributed import World
from ledgerlm.train.snapshot import reshard


@dataclass(frozen=True)
class Tasks:
    """What scoring a run's tasks needs beside the model: the items (``sets``; ``None``
    on a rank other than 0 until ``shared``), the token version's tokenizer, its BOS id
    and its EOS id (which ends a generation as a stop string does), the model's context
    (``seq_len``: a longer input is cut from the left) and the rows of one forward
    (``rows``: the validation batches', so no larger batch is made); ``static``: every
    batch padded to ``seq_len``, the validation batches' shape, which a compiled model
    (``train.compile``) was compiled for, so scoring tasks compiles nothing more."""

    sets: tuple[TaskSet, ...] | None
    tokenizer: Any  # tokenizers.Tokenizer
    bos: int | None
    eos: int | None
    seq_len: int
    rows: int
    static: bool = False

    def shared(self, world: World | None) -> Tasks:
        """These tasks with rank 0's items on every rank (one broadcast; every rank of a
        run with tasks calls it at the same point, the start of training)."""
        world = world or World()
        sets = world.broadcast_object(self.sets) if world.distributed else self.sets
        if sets is None:
            raise RuntimeError("the run's tasks were not resolved before training")
        return dataclasses.replace(self, sets=tuple(sets))

    def score(
        self, model: torch.nn.Module, world: World | None
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Every task's metrics on ``model`` (``task/<name>/<metric>``, flat) and the
        seconds each took, this rank scoring its share of the items. ``model`` is what
        the evaluator scores (the plain ``GPT``, or its asynchronous copy): the
        generating tasks decode on it, except when it is sharded."""
        world = world or World()
        if self.sets is None:
            raise RuntimeError("the run's tasks were not shared before the evaluation")
        metrics, seconds = score_tasks(
            model,
            self.sets,
            self.tokenizer,
            self.bos,
            seq_len=self.seq_len,
            rows=self.rows,
            ranks=ranks_of(world),
            decoder_model=None if world.sharded else model,
            eos=self.eos,
            static=self.static,
        )
        if world.sharded:
            reshard(model)
        return metrics, {name: round(s, 6) for name, s in seconds.items()}


def ranks_of(world: World) -> Ranks:
    """How the items are split over ``world``'s ranks: rank r scores items r::size,
    and the per-item sums cross the ranks as one gloo all-reduce of host float64 values
    (``World.all_reduce``), whatever the device."""
    if not world.distributed:
        return Ranks()

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        summed = world.all_reduce(t.detach().double().cpu().flatten().tolist(), torch.float64)
        return torch.tensor(summed, dtype=torch.float64).reshape(t.shape)

    return Ranks(world.rank, world.size, world.sharded, all_reduce=all_reduce)


def check_sharded(cfgs: Sequence[TaskConfig], world: World) -> None:
    """Exact tasks decode with a KV cache on the whole weights, which a sharded model
    (FSDP) does not hold on any rank: refused before the run starts, in one line."""
    exact = [t.name for t in cfgs if t.task_kind == "exact"]
    if exact and world.sharded:
        raise ValueError(
            f"eval.tasks {', '.join(exact)}: an exact task generates with the KV cache on "
            "whole weights, which FSDP shards; use train.parallel = 'ddp' (or one process)"
        )
