"""Resumable training: the checkpoint callback, which writes every checkpoint of a run
(periodic, final, and where a locked ledger stops it), and continuing a trainer from one.

A checkpoint is saved only between optimizer updates, after every other callback
has seen the update (so the evaluation of that step is already recorded and the
buffered per-step ledger rows are flushed first). It holds everything the next
update depends on: weights, optimizer state, trainer counters and history, the
data cursor and the torch RNG; a resumed trainer then makes bitwise the same
updates as an uninterrupted one (same thread count, deterministic kernels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ledgerlm.train.checkpoint import load_checkpoint, save_checkpoint
from ledgerlm.train.evaluate import EvalCallback, weights_digest
from ledgerlm.train.optim import Optimizer


def save_training(folder: Path, trainer, extra: dict[str, Any] | None = None) -> Path:
    """A resumable checkpoint of ``trainer``; ``extra`` adds e.g. run id and recipe digest."""
    s = trainer.state
    state_dict = getattr(trainer.batches, "state_dict", None)
    state = {
        **(extra or {}),
        "step": s.step,
        "ranks": trainer.world.size,  # with grad_accum: the micro-batches of one update
        "counters": s.counters(),
        "trainer": trainer.state_dict(),
        # None marks a stream that cannot say where it stands: such a checkpoint is
        # refused for resuming rather than silently restarting the data.
        "data": state_dict() if state_dict else None,
    }
    return save_checkpoint(folder, trainer.model, state, trainer.optimizer, trainer.world)


def load_training(folder: Path, model: torch.nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Restore weights, optimizer state and the torch RNG; return the JSON state.

    The caller builds the data stream from ``state["data"]`` and hands
    ``state["trainer"]`` to ``Trainer.load_state_dict``.
    """
    state = load_checkpoint(folder, model, optimizer, restore_rng=True)
    if state.get("data") is None or "trainer" not in state:
        raise ValueError(f"{folder}: checkpoint has no data cursor or trainer state to resume")
    return state


class CheckpointCallback:
    """Saves a resumable checkpoint every ``every`` updates (0 = never), timed in the
    ledger as a ``checkpoint`` phase that interrupts training; the run's other
    checkpoints are written by it too (``write``), so every one holds the same state.

    An asynchronous evaluation still being scored when the checkpoint is written is not
    in the ledger yet: the checkpoint says it is owed, and a resume from it scores the
    checkpoint's weights rather than leave it out (``ResumedEval``): the same snapshot
    when it was this step's (``checkpoint_every`` a multiple of ``eval.every_steps``)."""

    def __init__(
        self,
        folder: Path,
        every: int,
        extra: dict[str, Any] | None = None,
        evaluator: EvalCallback | None = None,
    ) -> None:
        self.folder, self.every, self.extra = Path(folder), every, extra or {}
        self.evaluator = evaluator

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        if self.every and trainer.state.step % self.every == 0:
            self.save(trainer)

    def on_train_end(self, trainer) -> None:
        pass

    def save(self, trainer) -> Path:
        """A periodic checkpoint, as a ``checkpoint`` phase interrupting training."""
        trainer.recorder.flush(trainer)  # the record up to this step goes in before the save
        with trainer.recorder.interrupt("checkpoint", trainer.state.step, periodic=True):
            return self.write(trainer)

    def write(self, trainer, **more: Any) -> Path:
        """The one way the run's checkpoints are written: periodic (``save``), the final
        one (``lab.skeleton.close_training``) and where a locked ledger stops the run,
        whose ``more`` state (the updates the ledger has not taken) goes in too."""
        owed = self.evaluator is not None and self.evaluator.owed
        extra = {**self.extra, **more, **({"owed_evaluation": True} if owed else {})}
        return save_training(self.folder, trainer, extra)


def checkpointer(trainer) -> CheckpointCallback:
    """The trainer's checkpoint callback, which writes every checkpoint of its run."""
    found = [cb for cb in trainer.callbacks if isinstance(cb, CheckpointCallback)]
    if len(found) != 1:
        raise ValueError(f"the trainer has {len(found)} checkpoint callbacks, not one")
    return found[0]


class ResumedEval(EvalCallback):
    """An evaluator that continues a run: it starts from the run's earlier evaluations
    and does not record a second row for a step the ledger already holds.

    Updates redone after a resume are bitwise those the killed process made, so an
    evaluation it recorded past the checkpoint scored the same weights: when the
    weights digest matches, that row stands; otherwise a fresh evaluation is recorded.

    ``owed``: the checkpoint was written while an evaluation due at its step (or before
    it, when asynchronous) was not yet recorded (a ledger locked past its timeout, an
    asynchronous one still being scored); one is made at the checkpoint's step before
    the first update, unless the ledger has it.
    """

    def __init__(
        self,
        *args: Any,
        earlier: list[dict[str, Any]],
        step: int,
        owed: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__(*args, **kw)
        self.recorded = {int(e["step"]): e for e in earlier if e["step"] > step}
        for e in sorted((e for e in earlier if e["step"] <= step), key=lambda e: e["step"]):
            self.history.append(e)
            self.observe(e, None)
        self.owed = owed and not (self.history and self.history[-1]["step"] == step)

    def on_train_start(self, trainer) -> None:
        """A run resumed from the snapshot that confirmed its target keeps it for the
        test, as the uninterrupted run did; one resumed past it cannot
        (``EvalCallback.test_snapshots``)."""
        super().on_train_start(trainer)
        c = self.confirming
        if c is not None and self.kept is None and c["snapshot"] == weights_digest(trainer.model):
            self.keep(trainer, None)
        if self.owed:
            self.run(trainer)

    def run(self, trainer, final: bool = False) -> dict[str, Any] | None:
        earlier = self.recorded.pop(trainer.state.step, None)
        if earlier is None or earlier["snapshot"] != weights_digest(trainer.model):
            return super().run(trainer, final)
        self.owed = False
        self.history.append(earlier)
        self.observe(earlier, trainer)
        return earlier
