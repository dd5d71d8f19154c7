"""The budget part of the target contract: stop at a token, wall-time or device-time cap."""

from __future__ import annotations

import time

import torch

from ledgerlm.config import EvalConfig


class BudgetCallback:
    """Stops training once ``budget_tokens`` training tokens were consumed, the run's
    wall time (counted from ``started_at``, a ``time.time()``, so every phase since the
    run began is included) reaches ``budget_seconds``, or its device time reaches
    ``budget_device_hours``.

    Device time is wall x the devices held (one per rank): what the ledger charged the
    run before this process, ``before`` = (wall seconds, device-seconds) (a resume after
    a run on another number of ranks; ``started_at`` then lies that many wall seconds
    back), plus the wall since this process's share began x this world's ranks.

    Under ``torchrun`` the clock is read on rank 0 only and its verdict is summed over
    the ranks, so every rank stops after the same update.
    """

    def __init__(
        self, cfg: EvalConfig, started_at: float, before: tuple[float, float] = (0.0, 0.0)
    ) -> None:
        self.tokens, self.seconds, self.started_at = (
            cfg.budget_tokens,
            cfg.budget_seconds,
            started_at,
        )
        self.device_hours = cfg.budget_device_hours
        self.before = before

    def device_seconds(self, ranks: int, now: float) -> float:
        """The run's device-seconds at ``now`` on ``ranks`` ranks of one device each."""
        wall_before, device_before = self.before
        return device_before + max(0.0, now - self.started_at - wall_before) * ranks

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        if s.should_stop:
            return
        if self.tokens and s.tokens >= self.tokens:
            s.should_stop, s.stop_reason = True, f"token budget ({self.tokens:,} tokens)"
            return
        if not (self.seconds or self.device_hours):
            return
        world = trainer.world
        now = time.time()
        wall = bool(self.seconds) and now - self.started_at >= self.seconds
        device = bool(self.device_hours) and (
            self.device_seconds(world.size, now) >= self.device_hours * 3600.0
        )
        over = [float(world.is_main and wall), float(world.is_main and device)]
        if world.distributed:
            over = world.all_reduce(over, torch.float64)
        if over[0] > 0:
            s.should_stop, s.stop_reason = True, f"time budget ({self.seconds:g} s)"
        elif over[1] > 0:
            s.should_stop = True
            s.stop_reason = f"device-time budget ({self.device_hours:g} device-hours)"

    def on_train_end(self, trainer) -> None:
        pass
