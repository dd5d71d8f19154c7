"""Trainer callbacks that are not evaluation: the per-update ledger and progress."""

from __future__ import annotations

from typing import Any


class StepLog:
    """Records every optimizer update (tokens and targets of that update, loss, grad
    norm, lr) in the ledger, buffered and written once per ``flush_every`` updates."""

    def __init__(self, flush_every: int) -> None:
        self.flush_every = max(1, flush_every)
        self.rows: list[dict[str, Any]] = []
        self._last = (0, 0, 0)  # step, tokens, targets at the previous record

    def on_train_start(self, trainer) -> None:
        s = trainer.state
        self._last = (s.step, s.tokens, s.targets)

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
        if len(self.rows) >= self.flush_every:
            self.flush(trainer)

    def on_train_end(self, trainer) -> None:
        self.flush(trainer)

    def flush(self, trainer) -> None:
        if trainer.clock and self.rows:
            trainer.clock.ledger.add_steps(trainer.clock.run_id, self.rows)
        self.rows = []


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
