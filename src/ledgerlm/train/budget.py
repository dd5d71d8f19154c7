"""The budget part of the target contract: stop at a token or wall-time cap."""

from __future__ import annotations

import time

import torch

from ledgerlm.config import EvalConfig


class BudgetCallback:
    """Stops training once ``budget_tokens`` training tokens were consumed or the run's
    wall time (counted from ``started_at``, a ``time.time()``, so every phase since the
    run began is included) reaches ``budget_seconds``.

    Under ``torchrun`` the clock is read on rank 0 only and its verdict is summed over
    the ranks, so every rank stops after the same update.
    """

    def __init__(self, cfg: EvalConfig, started_at: float) -> None:
        self.tokens, self.seconds, self.started_at = (
            cfg.budget_tokens,
            cfg.budget_seconds,
            started_at,
        )

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        if s.should_stop:
            return
        if self.tokens and s.tokens >= self.tokens:
            s.should_stop, s.stop_reason = True, f"token budget ({self.tokens:,} tokens)"
            return
        if not self.seconds:
            return
        world = trainer.world
        over = world.is_main and time.time() - self.started_at >= self.seconds
        if world.distributed:
            over = world.all_reduce([float(over)], torch.float64)[0] > 0
        if over:
            s.should_stop, s.stop_reason = True, f"time budget ({self.seconds:g} s)"

    def on_train_end(self, trainer) -> None:
        pass
