"""Trainer callbacks that are not evaluation: progress."""

from __future__ import annotations


class ProgressCallback:
    """Advances a progress task by one per update, showing loss and learning rate."""

    def __init__(self, task) -> None:
        self.task = task

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        self.task.advance(1, info=f"loss {s.loss:.3f} lr {s.lr:.1e}")

    def on_train_end(self, trainer) -> None:
        pass
