"""Evaluation on the fixed validation token set, and the target check.

The target is confirmed only here, at an evaluation bound to a weights snapshot.
"""

from __future__ import annotations

import copy
import hashlib
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ledgerlm.config import EvalConfig
from ledgerlm.tokens.packing import Batch
from ledgerlm.train.distributed import World
from ledgerlm.train.loss import per_target_loss
from ledgerlm.train.record import Section


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
        tensor = tensor.detach()
        if hasattr(tensor, "full_tensor"):  # a shard: every rank gathers the whole
            tensor = tensor.full_tensor()
        h.update(name.encode())
        h.update(tensor.cpu().contiguous().numpy().tobytes())
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
    device = next(model.parameters()).device  # batches go where the weights are
    total = torch.zeros(len(domains), dtype=torch.float64, device=device)
    count = torch.zeros(len(domains), dtype=torch.float64, device=device)
    mine = val[world.rank :: world.size]
    rounds = -(-len(val) // world.size) if world.sharded else len(mine)
    for i in range(rounds):
        # A sharded model gathers its weights in every forward, so every rank runs as
        # many forwards as the rank with the most batches; a spare one scores nothing.
        b = mine[i] if i < len(mine) else val[0]
        if device.type != "cpu":
            b = b.to(device, pin=True)
        logits = model(b.input_ids, b.position_ids, model.attention_spec(b.doc_ids, attention))
        if i >= len(mine):
            continue
        losses = per_target_loss(logits, b.targets)[b.loss_mask].double()
        dom = b.target_domains[b.loss_mask]
        total.index_add_(0, dom, losses)
        count.index_add_(0, dom, torch.ones_like(losses))
    total, count = total.cpu(), count.cpu()
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
    """Evaluates at the contract's interval and at the end; applies the confirmation rule.

    The interval is ``every_steps`` updates, or each time ``every_tokens`` more training
    tokens were consumed. The target is confirmed at the evaluation that completes
    ``confirm`` consecutive evaluations at or below it (on ``cfg.metric``).

    With ``asynchronous``, an evaluation scores a copy of the weights in a background
    thread while training goes on, and its result is bound to that copy's step and
    hash. It is collected at the first update boundary after it finishes: there the
    train segment is cut by an ``eval`` phase (holding only the time training waited
    for the result, if any), so time-to-target runs until the result was known. The
    phase detail keeps the evaluation's own wall and compute (thread CPU) seconds.
    One evaluation is in flight at a time; the last one is always synchronous.
    """

    val: list[Batch]
    cfg: EvalConfig
    attention: str
    domains: list[str]
    history: list[dict[str, Any]] = field(default_factory=list)
    reached_step: int | None = None
    _streak: int = 0
    _prev_tokens: int = 0
    _pending: tuple[Future, dict[str, Any]] | None = None
    _pool: ThreadPoolExecutor | None = None

    def on_train_start(self, trainer) -> None:
        self._prev_tokens = trainer.state.tokens

    def on_step_end(self, trainer) -> None:
        self.collect(trainer, wait=False)
        s = trainer.state
        if self.cfg.every_tokens:
            n = self.cfg.every_tokens
            due = s.tokens // n > self._prev_tokens // n
        else:
            due = s.step % self.cfg.every_steps == 0
        self._prev_tokens = s.tokens
        if due and not s.should_stop:
            self.run(trainer)

    def on_train_end(self, trainer) -> None:
        self.collect(trainer, wait=True)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if not self.history or self.history[-1]["step"] != trainer.state.step:
            self.run(trainer, final=True)

    def score(self, trainer) -> dict[str, float]:
        world = getattr(trainer, "world", None)
        return evaluate(trainer.model, self.val, self.attention, self.domains, world)

    def _base(self, trainer) -> dict[str, Any]:
        s = trainer.state
        return {"step": s.step, "tokens": s.tokens, "targets": s.targets, "updates": s.step}

    def run(self, trainer, final: bool = False) -> dict[str, Any] | None:
        """Evaluate the current weights now (or submit them, when asynchronous)."""
        if self.cfg.asynchronous and not final:
            self.submit(trainer)
            return None
        with trainer.recorder.interrupt("eval", trainer.state.step) as section:
            metrics = self.score(trainer)
            snapshot = weights_digest(trainer.model)
        record = {**self._base(trainer), "metrics": metrics, "snapshot": snapshot}
        return self._record(record, trainer, section)

    def submit(self, trainer) -> None:
        """Copy the weights and score the copy in the background."""
        self.collect(trainer, wait=True)
        snapshot_model = copy.deepcopy(trainer.model)
        # An in-place compiled module would call the original's compiled forward.
        if getattr(snapshot_model, "_compiled_call_impl", None) is not None:
            snapshot_model._compiled_call_impl = None
        base = {**self._base(trainer), "snapshot": weights_digest(snapshot_model)}
        autocast = trainer.autocast

        def work() -> tuple[dict[str, float], float, float]:
            wall, cpu = time.perf_counter(), time.thread_time()
            with autocast():  # autocast state is per thread
                metrics = evaluate(snapshot_model, self.val, self.attention, self.domains)
            return metrics, time.perf_counter() - wall, time.thread_time() - cpu

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ledgerlm-eval")
        self._pending = (self._pool.submit(work), base)

    def collect(self, trainer, wait: bool) -> dict[str, Any] | None:
        """Record a finished background evaluation (waiting for it when ``wait``)."""
        if self._pending is None or not (wait or self._pending[0].done()):
            return None
        future, base = self._pending
        self._pending = None
        with trainer.recorder.interrupt("eval", trainer.state.step) as section:
            metrics, wall, cpu = future.result()
            section.detail.update(
                asynchronous=True,
                snapshot_step=base["step"],
                eval_wall_seconds=round(wall, 6),
                eval_compute_seconds=round(cpu, 6),
            )
        return self._record({**base, "metrics": metrics}, trainer, section)

    def _record(self, record: dict[str, Any], trainer, section: Section) -> dict[str, Any]:
        trainer.recorder.evaluation(record, section, trainer.state.counters())
        self.history.append(record)
        self.observe(record, trainer)
        return record

    def observe(self, record: dict[str, Any], trainer) -> None:
        """Apply the confirmation rule to the next evaluation in step order."""
        value = record["metrics"].get(self.cfg.metric)
        ok = isinstance(value, int | float) and math.isfinite(value)
        self._streak = self._streak + 1 if ok and value <= self.cfg.target_loss else 0
        if self.reached_step is None and self._streak >= self.cfg.confirm:
            self.reached_step = record["step"]
            if trainer is not None and self.cfg.stop_at_target:
                trainer.state.should_stop, trainer.state.stop_reason = True, "target confirmed"
