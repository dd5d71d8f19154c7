"""Trainer callbacks that are not evaluation: the per-update ledger and progress."""

from __future__ import annotations

import time
from typing import Any


class StepLog:
    """Records every optimizer update (tokens and targets of that update, loss, grad
    norm, lr) in the ledger, buffered and written once per ``flush_every`` updates.

    Each write is also the heartbeat of the clock's open phase (``Ledger.beat``), so a
    process killed mid-segment leaves the last time it was known alive. The buffer is
    therefore also written at the first update of each newly opened phase and whenever
    ``flush_seconds`` passed since the last write: with evaluations cutting training
    into segments every ``flush_every`` updates, a count alone would beat each segment
    only just before it ends normally, never while it could be killed.
    """

    def __init__(self, flush_every: int, flush_seconds: float = 2.0) -> None:
        self.flush_every = max(1, flush_every)
        self.flush_seconds = flush_seconds
        self.rows: list[dict[str, Any]] = []
        self._last = (0, 0, 0)  # step, tokens, targets at the previous record
        self._flushed_at = time.monotonic()
        self._beaten: int | None = None  # id of the phase the last write beat

    def on_train_start(self, trainer) -> None:
        s = trainer.state
        self._last = (s.step, s.tokens, s.targets)
        self._flushed_at = time.monotonic()

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        step, tokens, targets = self._last
        if s.step == step:  # no update happened (a skipped step)
            return
        self.rows.append(
            {
                "step": s.step,
                "tokens": s.tokens - tokens,
                "targets": s.targets - targets,
                "loss": s.loss,
                "grad_norm": s.grad_norm,
                "lr": s.lr,
            }
        )
        self._last = (s.step, s.tokens, s.targets)
        if len(self.rows) >= self.flush_every or self._beat_due(trainer):
            self.flush(trainer)

    def on_train_end(self, trainer) -> None:
        self.flush(trainer)

    def _beat_due(self, trainer) -> bool:
        phase = trainer.clock.current if trainer.clock else None
        if phase is None:
            return False
        late = time.monotonic() - self._flushed_at >= self.flush_seconds
        return late or phase.id != self._beaten

    def flush(self, trainer) -> None:
        """Write the buffered rows, then beat the open phase up to their last step."""
        clock = trainer.clock
        if clock and self.rows:
            clock.ledger.add_steps(clock.run_id, self.rows)
            phase = clock.current
            if phase is not None:
                clock.ledger.beat(phase.id, step=int(self.rows[-1]["step"]))
                self._beaten = phase.id
        self.rows = []
        self._flushed_at = time.monotonic()


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
