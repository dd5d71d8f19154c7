"""The training loop: accumulation with one global denominator, clipping, a
non-finite guard, and callbacks for everything else (evaluation, ledger, progress).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ledgerlm.config import TrainConfig
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.tokens.packing import Batch
from ledgerlm.train.loss import NoTargetsError, cross_entropy_sum
from ledgerlm.train.optim import lr_at


class NonFiniteLossError(FloatingPointError):
    """A NaN or infinite loss or gradient never passes silently."""


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    tokens: int = 0  # real (non-padding) input tokens consumed
    targets: int = 0  # supervised targets trained on
    rows: int = 0
    loss: float = math.nan  # loss of the last update (global token mean)
    grad_norm: float = math.nan  # before clipping
    lr: float = 0.0
    should_stop: bool = False
    stop_reason: str = ""

    def counters(self) -> dict[str, float]:
        return {
            "optimizer_updates": self.step,
            "tokens": self.tokens,
            "supervised_targets": self.targets,
            "rows": self.rows,
        }


class Callback(Protocol):
    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_step_end(self, trainer: Trainer) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...


class Trainer:
    """Runs optimizer updates until ``max_steps`` or until a callback asks to stop."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        batches: Iterator[Batch],
        attention: str,
        callbacks: Sequence[Callback] = (),
        clock: PhaseClock | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.batches, self.attention = batches, attention
        self.callbacks = list(callbacks)
        self.clock = clock
        self.state = TrainState()

    def train_step(self) -> float:
        """One optimizer update over ``grad_accum`` micro-batches.

        Each micro-batch contributes sum(loss) / N where N counts the supervised
        targets of the whole update, so the gradient equals that of one big batch
        whatever the split.
        """
        micro = [next(self.batches) for _ in range(self.cfg.grad_accum)]
        n_targets = sum(mb.num_targets for mb in micro)
        if n_targets == 0:
            raise NoTargetsError(f"step {self.state.step + 1}: no supervised targets")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64)
        for mb in micro:
            if mb.num_targets == 0:
                continue
            logits = self.model(mb.input_ids, mb.position_ids, mb.attention_mask(self.attention))
            loss_sum, _ = cross_entropy_sum(logits, mb.targets, mb.loss_mask)
            (loss_sum / n_targets).backward()
            total += loss_sum.detach().double()
        loss = float(total / n_targets)
        grad_norm = float(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip or math.inf)
        )
        step = self.state.step + 1
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise NonFiniteLossError(f"step {step}: loss={loss} grad_norm={grad_norm}")
        lr = lr_at(step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()

        s = self.state
        s.step, s.loss, s.grad_norm, s.lr = step, loss, grad_norm, lr
        s.targets += n_targets
        s.tokens += sum(int(mb.valid.sum()) for mb in micro)
        s.rows += sum(mb.input_ids.shape[0] for mb in micro)
        return loss

    def fit(self) -> TrainState:
        if self.clock:
            self.clock.start("train", self.state.step)
        try:
            for cb in self.callbacks:
                cb.on_train_start(self)
            while self.state.step < self.cfg.max_steps and not self.state.should_stop:
                self.train_step()
                for cb in self.callbacks:
                    cb.on_step_end(self)
            if not self.state.stop_reason:
                self.state.stop_reason = "max_steps"
            for cb in self.callbacks:
                cb.on_train_end(self)
        finally:
            if self.clock:
                self.clock.stop(self.state.step)
        return self.state
