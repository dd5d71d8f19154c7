"""The trainer callback that shows progress: one advance per update."""

from __future__ import annotations

import time


class ProgressCallback:
    """Advances a progress task by one per update, showing the loss, the learning rate
    and the tokens per second since the previous update (evaluations included).

    The loss is the latest the trainer read (``TrainState.loss``): between two ledger
    flushes, the previous update's, so showing it never waits for the device."""

    def __init__(self, task) -> None:
        self.task = task
        self._last = time.perf_counter()

    def on_train_start(self, trainer) -> None:
        self._last = time.perf_counter()

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        now = time.perf_counter()
        rate = s.step_tokens / (now - self._last) if now > self._last else 0.0
        self._last = now
        self.task.advance(1, info=f"loss {s.loss:.3f} lr {s.lr:.1e} tok/s {rate:,.0f}")

    def on_train_end(self, trainer) -> None:
        pass
