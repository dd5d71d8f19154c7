"""Evaluation on the fixed validation token set, and the target check.

The target is confirmed only here, at an evaluation bound to a weights snapshot.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ledgerlm.config import EvalConfig
from ledgerlm.tokens.packing import Batch
from ledgerlm.train.distributed import World
from ledgerlm.train.loss import per_target_loss


def unigram_entropy(val: Sequence[Batch]) -> float:
    """Entropy (nat) of the validation targets' own unigram distribution.

    No model that ignores context can score below it on these targets, so a
    target under it can only be reached by using context.
    """
    counts = np.bincount(
        np.concatenate([b.targets[b.loss_mask].numpy() for b in val]), minlength=1
    ).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def weights_digest(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: names the exact snapshot an evaluation scored."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    val: Sequence[Batch],
    attention: str,
    domains: Sequence[str],
    world: World | None = None,
) -> dict[str, float]:
    """Token-mean loss (nat/token) overall and per domain of the target's document.

    Under ``torchrun`` each rank scores every ``size``-th batch and the sums are
    all-reduced, so every rank gets the same figures as one process would.
    """
    world = world or World()
    model.eval()
    total = torch.zeros(len(domains), dtype=torch.float64)
    count = torch.zeros(len(domains), dtype=torch.float64)
    for b in val[world.rank :: world.size]:
        logits = model(b.input_ids, b.position_ids, b.attention_mask(attention))
        losses = per_target_loss(logits, b.targets)[b.loss_mask].double()
        dom = b.target_domains[b.loss_mask]
        total.index_add_(0, dom, losses)
        count.index_add_(0, dom, torch.ones_like(losses))
    if world.distributed:
        summed = world.all_reduce(torch.cat([total, count]).tolist(), torch.float64)
        sums = torch.tensor(summed, dtype=torch.float64)
        total, count = sums[: len(domains)], sums[len(domains) :]
    metrics = {"loss": float(total.sum() / count.sum())}
    for i, name in enumerate(domains):
        if count[i] > 0:
            metrics[f"loss/{name}"] = float(total[i] / count[i])
    return metrics


@dataclass
class EvalCallback:
    """Evaluates every ``every_steps`` updates and at the end; stops once the target is met."""

    val: list[Batch]
    cfg: EvalConfig
    attention: str
    domains: list[str]
    metric: str = "loss"
    history: list[dict[str, Any]] = field(default_factory=list)
    reached_step: int | None = None

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        s = trainer.state
        if s.step % self.cfg.every_steps == 0:
            self.run(trainer)

    def on_train_end(self, trainer) -> None:
        if not self.history or self.history[-1]["step"] != trainer.state.step:
            self.run(trainer)

    def score(self, trainer) -> dict[str, float]:
        world = getattr(trainer, "world", None)
        return evaluate(trainer.model, self.val, self.attention, self.domains, world)

    def run(self, trainer) -> dict[str, Any]:
        s = trainer.state
        clock = trainer.clock
        phase_id = None
        if clock:
            with clock.interrupt("eval", s.step) as phase:
                metrics = self.score(trainer)
                snapshot = weights_digest(trainer.model)
                phase_id = phase.id
        else:
            metrics = self.score(trainer)
            snapshot = weights_digest(trainer.model)
        record = {
            "step": s.step,
            "tokens": s.tokens,
            "targets": s.targets,
            "updates": s.step,
            "metrics": metrics,
            "snapshot": snapshot,
        }
        if clock:
            clock.ledger.add_evaluation(clock.run_id, phase_id=phase_id, **record)
            clock.ledger.set_counters(clock.run_id, s.counters())
        self.history.append(record)
        value = metrics[self.metric]
        if self.reached_step is None and math.isfinite(value) and value <= self.cfg.target_loss:
            self.reached_step = s.step
            if self.cfg.stop_at_target:
                s.should_stop, s.stop_reason = True, "target confirmed"
        return record
