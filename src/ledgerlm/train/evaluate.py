"""Evaluation on the fixed validation token set, and the target check.

The target is confirmed only here, at an evaluation bound to a weights snapshot.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from ledgerlm.config import EvalConfig
from ledgerlm.ledger import events
from ledgerlm.ledger.target import meets
from ledgerlm.model.dtensor import local_data
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.tokenizer import TokenText
from ledgerlm.train.distributed import World
from ledgerlm.train.record import Section
from ledgerlm.train.snapshot import reshard, swapped, weights_digest
from ledgerlm.train.stopping import StopRule
from ledgerlm.train.task_eval import Tasks


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


@dataclass(frozen=True)
class Share:
    """One rank's validation batches on the model's device (``placed``), kept there
    for every evaluation of a run: the batches it scores, the rounds every rank goes
    through (``rounds``: the most batches a rank has), and each token id's UTF-8 bytes
    and characters (``sizes``)."""

    mine: list[Batch]
    rounds: int
    spare: Batch | None  # run, not scored, by a sharded rank out of batches of its own
    sizes: torch.Tensor | None  # (2, V) float64: bytes and characters per token id


def placed(
    val: Sequence[Batch],
    world: World | None,
    device: torch.device,
    text: TokenText | None = None,
) -> Share:
    """This rank's share of ``val`` (every ``size``-th batch under ``torchrun``) copied
    to ``device`` once, through pinned host memory (on the CPU the batches themselves:
    the same path, nothing copied), with the token text's sizes.

    Under ``torchrun`` every rank goes through as many rounds as the rank with the
    most batches, so an evaluation in pieces ends at the same update boundary on every
    rank (its sums are then all-reduced). A sharded model gathers its weights in every
    forward, so there a rank short of batches runs a spare (its own first batch, or the
    set's) and scores nothing; a replica runs nothing in such a round.
    """
    world = world or World()

    def put(b: Batch) -> Batch:
        return b if device.type == "cpu" else b.to(device, pin=True)

    mine = [put(b) for b in val[world.rank :: world.size]]
    rounds = -(-len(val) // world.size)
    spare = (mine[0] if mine else put(val[0])) if world.sharded and rounds > len(mine) else None
    sizes = None
    if text is not None:
        sizes = torch.from_numpy(np.stack([text.bytes, text.chars])).to(device, torch.float64)
    return Share(mine, rounds, spare, sizes)


def device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are: its batches go there."""
    return next(model.parameters()).device


class Scoring:
    """One evaluation's per-domain loss sums, batch by batch, so it can be done in
    pieces (``advance``) and finished later (``metrics``).

    Under ``torchrun`` each rank scores its ``share`` (every ``size``-th batch) and the
    sums are all-reduced, so every rank gets the same figures as one process would; a
    sharded model frees the weights it gathered for the forwards after them
    (``reshard``). The head scores a chunk of rows at a time (``GPT.forward(...,
    targets=)``): no (B, T, V) logits; the sums stay on the device until ``metrics``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        share: Share,
        attention: str,
        domains: Sequence[str],
        world: World | None = None,
    ) -> None:
        self.model, self.share, self.attention, self.domains = model, share, attention, domains
        self.world = world or World()
        self.device = device_of(model)
        self.rounds = share.rounds
        self.done = 0
        sums = torch.zeros(4, len(domains), dtype=torch.float64, device=self.device)
        self.total, self.count, self.bytes, self.chars = sums

    @torch.no_grad()
    def advance(self, rounds: int | None = None) -> bool:
        """Score up to ``rounds`` more batches on every rank (all that are left when
        None); True once every batch is scored."""
        self.model.eval()
        mine, sizes = self.share.mine, self.share.sizes
        end = self.rounds if rounds is None else min(self.rounds, self.done + rounds)
        for i in range(self.done, end):
            b = mine[i] if i < len(mine) else self.share.spare
            if b is None:  # a replica out of batches: no forward, no collective
                continue
            mask = self.model.attention_spec(b.doc_ids, self.attention)
            losses = self.model(b.input_ids, b.position_ids, mask, targets=b.targets)
            if i >= len(mine):
                continue
            # unsupervised positions add 0 to domain 0: no boolean selection, no sync
            keep = b.loss_mask.flatten()
            dom = b.target_domains.flatten().clamp(min=0)
            self.total.index_add_(0, dom, torch.where(keep, losses.flatten().double(), 0.0))
            self.count.index_add_(0, dom, keep.double())
            if sizes is not None:
                kept = sizes[:, b.targets.flatten()] * keep
                self.bytes.index_add_(0, dom, kept[0])
                self.chars.index_add_(0, dom, kept[1])
        if self.world.sharded:
            reshard(self.model)
        self.done = end
        return self.done == self.rounds

    def then(self, share: Share) -> None:
        """Go on with the next chunk of batches (``evaluate``'s ``chunk``), the sums kept."""
        self.share, self.rounds, self.done = share, share.rounds, 0

    def metrics(self) -> dict[str, float]:
        """Token-mean loss (nat/token) overall and per domain, summed over the ranks; with
        the token text, bits per UTF-8 byte (``bpb``, overall and per domain) and nats
        per character (``nats_per_char``) of the same targets."""
        sums = torch.stack([self.total, self.count, self.bytes, self.chars]).cpu()
        if self.world.distributed:
            summed = self.world.all_reduce(sums.flatten().tolist(), torch.float64)
            sums = torch.tensor(summed, dtype=torch.float64).reshape(sums.shape)
        total, count, n_bytes, n_chars = sums
        metrics = {"loss": float(total.sum() / count.sum())}
        for i, name in enumerate(self.domains):
            if count[i] > 0:
                metrics[f"loss/{name}"] = float(total[i] / count[i])
        if self.share.sizes is not None and n_bytes.sum() > 0:
            metrics["bpb"] = float(total.sum() / n_bytes.sum()) / math.log(2)
            metrics["nats_per_char"] = float(total.sum() / n_chars.sum())
            for i, name in enumerate(self.domains):
                if n_bytes[i] > 0:
                    metrics[f"bpb/{name}"] = float(total[i] / n_bytes[i]) / math.log(2)
        return metrics


def evaluate(
    model: torch.nn.Module,
    val: Sequence[Batch],
    attention: str,
    domains: Sequence[str],
    world: World | None = None,
    text: TokenText | None = None,
    chunk: int = 0,
) -> dict[str, float]:
    """Token-mean loss (nat/token) overall and per domain of the target's document, and
    with ``text`` bits per byte and nats per character (every rank under ``torchrun``;
    see ``Scoring``). ``chunk`` > 0 places that many batches per rank on the device at
    a time (the test split: its device memory stays that of ``chunk`` batches, its time
    grows with its tokens); 0 places them all at once."""
    step = chunk * (world or World()).size or len(val)
    scoring = None
    for start in range(0, len(val), step):
        share = placed(val[start : start + step], world, device_of(model), text)
        if scoring is None:
            scoring = Scoring(model, share, attention, domains, world)
        else:
            scoring.then(share)
        scoring.advance()
    if scoring is None:
        raise ValueError("nothing to evaluate: no batches")
    return scoring.metrics()


@dataclass
class EvalCallback:
    """Evaluates at the contract's interval and at the end; applies the confirmation rule.

    The interval is ``every_steps`` updates, or each time ``every_tokens`` more training
    tokens were consumed. The target is confirmed at the evaluation that completes
    ``confirm`` consecutive evaluations at or below it (on ``cfg.target()``: the
    metric in nat/token, or in bits per byte with ``target_bpb``).

    With ``asynchronous``, an evaluation scores a copy of the weights in a background
    thread while training goes on, and its result is bound to that copy's step and
    hash. It is collected at the first update boundary after it finishes: there the
    train segment is cut by an ``eval`` phase (holding only the time training waited
    for the result, if any), so time-to-target runs until the result was known. The
    phase detail keeps the evaluation's own wall and compute (thread CPU) seconds.
    One evaluation is in flight at a time; the last one is always synchronous.

    The run's downstream ``tasks`` (``train.task_eval``) are scored at every evaluation
    on the snapshot the validation loss scored, their metrics (``task/<name>/...``)
    merged into the evaluation's, so the confirmation rule reads them, and their
    seconds per task in the ``eval`` phase's detail (``task_seconds``): in the same
    phase as the validation loss, in the background thread on the same copy, or at the
    boundary of the last piece with the same weights swapped in.

    The snapshot that confirms the target is the one the test split is scored on after
    training (``test_snapshots``, ``score_test``), and the final weights as well when
    they differ. Its weights are kept (``kept``) where training goes on past it: the
    asynchronous copy that scored it, as it is, or a CPU copy of the trainer's
    parameters' local data (each rank its own shard) when ``stop_at_target`` is off;
    nothing when the run stops on them. Only the ranks that score the test keep them.

    Under ``torchrun`` a background thread cannot take part in the ranks' collectives
    (and a sharded model cannot be copied), so every rank keeps a copy of its own
    parameters' data at the due step and scores it ``PIECE_ROUNDS`` batches at a time
    at the following update boundaries, swapping it in for the length of each piece:
    an ``eval`` phase each, the last one holding the result (and the tasks). Every rank
    finishes at the same boundary, so the confirmation rule stops them all after the
    same update.
    """

    val: list[Batch]
    cfg: EvalConfig
    attention: str
    domains: list[str]
    text: TokenText | None = None  # with it, evaluations also give bits per byte
    rules: Sequence[StopRule] = ()  # what may stop the run early (``train.stopping``)
    tasks: Tasks | None = None  # the downstream tasks scored at each evaluation
    history: list[dict[str, Any]] = field(default_factory=list)
    reached_step: int | None = None
    owed: bool = False  # an evaluation was due and its result is not recorded yet
    _streak: int = 0
    _prev_tokens: int = 0
    _pending: tuple[Future, dict[str, Any], torch.nn.Module] | None = None
    _pool: ThreadPoolExecutor | None = None
    _pieces: tuple[Scoring, list[torch.Tensor], dict[str, Any]] | None = None
    _share: Share | None = None  # this rank's validation batches, on the device once
    confirming: dict[str, Any] | None = None  # the evaluation that confirmed the target
    kept: list[torch.Tensor] | None = None  # its weights, where training went past them
    PIECE_ROUNDS: ClassVar[int] = 1  # batches per rank scored at each update boundary
    TEST_CHUNK: ClassVar[int] = 64  # test batches per rank on the device at a time

    def on_train_start(self, trainer) -> None:
        self._prev_tokens = trainer.state.tokens
        if self.tasks is not None:  # rank 0's items on every rank, before any evaluation
            self.tasks = self.tasks.shared(getattr(trainer, "world", None))

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
            self.owed = True
            self.run(trainer)

    def on_train_end(self, trainer) -> None:
        self.collect(trainer, wait=True)
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if not self.history or self.history[-1]["step"] != trainer.state.step:
            self.owed = True
            self.run(trainer, final=True)

    def score(self, trainer) -> dict[str, float]:
        scoring = self.scoring(trainer, trainer.model)
        scoring.advance()
        return scoring.metrics()

    def scoring(self, trainer, model: torch.nn.Module) -> Scoring:
        """An evaluation of ``model`` on the validation batches, which are placed on the
        device at the run's first evaluation and kept there for the others."""
        world = getattr(trainer, "world", None)
        if self._share is None:
            self._share = placed(self.val, world, device_of(model), self.text)
        return Scoring(model, self._share, self.attention, self.domains, world)

    def score_tasks(
        self, trainer, model: torch.nn.Module, detail: dict[str, Any]
    ) -> dict[str, float]:
        """The tasks' metrics on ``model`` (the snapshot the validation loss scores),
        their seconds per task put in the ``eval`` phase's ``detail``; none without tasks."""
        if self.tasks is None:
            return {}
        metrics, seconds = self.tasks.score(model, getattr(trainer, "world", None))
        detail["task_seconds"] = seconds
        return metrics

    def test_snapshots(self, trainer) -> list[dict[str, Any]]:
        """The snapshots the test split is scored on after training, in order: the one
        that confirmed the target (role ``confirming``), then the final weights (role
        ``final``) when their digest differs; the final weights alone when the target was
        not confirmed. A run resumed past its confirmation holds the confirming weights
        no more (unless it resumed from them): its final weights are scored, with a
        ``note`` saying so. Every rank that scores the test calls it (the digest of a
        sharded model is a collective)."""
        step = trainer.state.step
        final: dict[str, Any] = {"role": "final", "step": step, "weights": None}
        last = self.history[-1] if self.history else None  # on_train_end evaluated here
        scored = last is not None and last["step"] == step
        final["snapshot"] = last["snapshot"] if scored else weights_digest(trainer.model)
        c = self.confirming
        if c is None:
            return [final]
        confirming = {"role": "confirming", "step": c["step"], "snapshot": c["snapshot"]}
        if c["snapshot"] == final["snapshot"]:
            return [{**confirming, "weights": None}]
        if self.kept is None:
            note = f"the confirming snapshot (step {c['step']}) was not kept across a resume"
            return [{**final, "note": note}]
        return [{**confirming, "weights": self.kept}, final]

    def score_test(
        self, trainer, test: Sequence[Batch], snapshot: dict[str, Any]
    ) -> dict[str, Any]:
        """A test record: a ``snapshot`` of ``test_snapshots`` scored on the held-out
        ``test`` batches in the numerics it trains with, ``TEST_CHUNK`` batches per rank
        on the device at a time, as ``test/`` metrics, with its role, step, the digest of
        the weights scored and the seconds it took. This process scores them all; with a
        sharded model every rank takes part."""
        world = trainer.world if trainer.world.sharded else None
        weights = snapshot.get("weights")
        start = time.perf_counter()
        with swapped(trainer.model, weights) if weights is not None else nullcontext():
            # kept weights are checked against the digest their evaluation recorded
            digest = weights_digest(trainer.model) if weights is not None else None
            if digest not in (None, snapshot["snapshot"]):
                raise RuntimeError(
                    f"the {snapshot['role']} snapshot's weights digest {digest} is not "
                    f"the {snapshot['snapshot']} its evaluation recorded"
                )
            with trainer.autocast():
                args = (self.attention, self.domains, world, self.text)
                metrics = evaluate(trainer.model, test, *args, chunk=self.TEST_CHUNK)
        record = {k: v for k, v in snapshot.items() if k != "weights"}
        return {
            **record,
            "targets": sum(b.num_targets for b in test),
            "metrics": {f"test/{k}": v for k, v in metrics.items()},
            "seconds": round(time.perf_counter() - start, 6),
        }

    def _base(self, trainer) -> dict[str, Any]:
        s = trainer.state
        return {
            "step": s.step,
            "tokens": s.tokens,
            "targets": s.targets,
            "updates": s.step,
            "consumed": dict(s.domain_tokens),
        }

    def run(self, trainer, final: bool = False) -> dict[str, Any] | None:
        """Evaluate the current weights now (or submit them, when asynchronous)."""
        if self.cfg.asynchronous and not final:
            self.submit(trainer)
            return None
        with trainer.recorder.interrupt("eval", trainer.state.step) as section:
            metrics = self.score(trainer)
            metrics.update(self.score_tasks(trainer, trainer.model, section.detail))
            snapshot = weights_digest(trainer.model)
        record = {**self._base(trainer), "metrics": metrics, "snapshot": snapshot}
        return self._record(record, trainer, section)

    def submit(self, trainer) -> None:
        """Copy the weights and score the copy in the background (in one process) or in
        pieces at the following update boundaries (under torchrun, where only the
        ranks' main threads may take part in collectives)."""
        self.collect(trainer, wait=True)
        if trainer.world.distributed:
            base = {**self._base(trainer), "snapshot": weights_digest(trainer.model)}
            weights = [local_data(p).clone() for p in trainer.model.parameters()]
            scoring = self.scoring(trainer, trainer.model)
            self._pieces = (scoring, weights, base)
            return
        snapshot_model = copy.deepcopy(trainer.model)
        # An in-place compiled module would call the original's compiled forward.
        if getattr(snapshot_model, "_compiled_call_impl", None) is not None:
            snapshot_model._compiled_call_impl = None
        base = {**self._base(trainer), "snapshot": weights_digest(snapshot_model)}
        autocast = trainer.autocast
        scoring = self.scoring(trainer, snapshot_model)

        def work() -> tuple[dict[str, float], dict[str, Any], float, float]:
            wall, cpu = time.perf_counter(), time.thread_time()
            detail: dict[str, Any] = {}
            with autocast():  # autocast state is per thread
                scoring.advance()
                metrics = scoring.metrics()
                metrics.update(self.score_tasks(trainer, snapshot_model, detail))
            return metrics, detail, time.perf_counter() - wall, time.thread_time() - cpu

        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ledgerlm-eval")
        self._pending = (self._pool.submit(work), base, snapshot_model)

    def collect(self, trainer, wait: bool) -> dict[str, Any] | None:
        """Record a finished background evaluation (waiting for it when ``wait``)."""
        if self._pieces is not None:
            return self._next_piece(trainer, wait)
        if self._pending is None or not (wait or self._pending[0].done()):
            return None
        future, base, snapshot_model = self._pending
        self._pending = None
        with trainer.recorder.interrupt("eval", trainer.state.step) as section:
            metrics, detail, wall, cpu = future.result()
            section.detail.update(
                **detail,
                asynchronous=True,
                snapshot_step=base["step"],
                eval_wall_seconds=round(wall, 6),
                eval_compute_seconds=round(cpu, 6),
            )
        weights = [p.detach() for p in snapshot_model.parameters()]
        return self._record({**base, "metrics": metrics}, trainer, section, weights)

    def _next_piece(self, trainer, wait: bool) -> dict[str, Any] | None:
        """Score the snapshot on one more batch per rank (all the rest when ``wait``),
        as an ``eval`` phase cutting training; record it once every batch is scored."""
        scoring, weights, base = self._pieces
        with trainer.recorder.interrupt("eval", trainer.state.step) as section:
            section.detail.update(asynchronous=True, snapshot_step=base["step"])
            with swapped(trainer.model, weights):
                done = scoring.advance(None if wait else self.PIECE_ROUNDS)
                tasks = self.score_tasks(trainer, trainer.model, section.detail) if done else {}
            metrics = {**scoring.metrics(), **tasks} if done else None
        if metrics is None:
            return None
        self._pieces = None
        return self._record({**base, "metrics": metrics}, trainer, section, weights)

    def _record(
        self,
        record: dict[str, Any],
        trainer,
        section: Section,
        weights: list[torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        trainer.recorder.evaluation(record, section, trainer.state.counters())
        self.owed = False
        self.history.append(record)
        self.observe(record, trainer, weights)
        return record

    def keep(self, trainer, weights: list[torch.Tensor] | None) -> None:
        """Keep the confirming snapshot's weights for the test (see the class): the
        asynchronous copy ``weights`` that scored it, or a CPU copy of the trainer's own
        when training goes on past them; on the ranks that score the test only, and
        none when training ends on them."""
        world = getattr(trainer, "world", None) or World()
        if not (world.is_main or world.sharded):
            return
        s, limit = trainer.state, getattr(getattr(trainer, "cfg", None), "max_steps", None)
        ending = s.should_stop or (limit is not None and s.step >= limit)
        if weights is not None:
            self.kept = weights
        elif not self.cfg.stop_at_target and not ending:  # else they are the final weights
            params = trainer.model.parameters()
            self.kept = [local_data(p).detach().to("cpu", copy=True) for p in params]

    def observe(
        self, record: dict[str, Any], trainer, weights: list[torch.Tensor] | None = None
    ) -> None:
        """Apply the confirmation rule to the next evaluation in step order; ``weights``
        are the asynchronous snapshot's that ``record`` scored (None: the trainer's)."""
        cfg = self.cfg
        metric, threshold, _ = cfg.target()
        ok = meets(record["metrics"], metric, threshold, cfg.targets, cfg.confirm_by)
        self._streak = self._streak + 1 if ok else 0
        if self.reached_step is None and self._streak >= self.cfg.confirm:
            self.reached_step, self.confirming = record["step"], record
            if trainer is not None:
                self.keep(trainer, weights)
            if trainer is not None and self.cfg.stop_at_target:
                trainer.state.should_stop, trainer.state.stop_reason = True, "target confirmed"
        if trainer is None or self.reached_step is not None or trainer.state.should_stop:
            return
        for rule in self.rules:
            stop = rule(record, self.history)
            if stop is not None:
                state = trainer.state
                state.should_stop, state.stop_reason, state.stop_status = (
                    True,
                    stop.reason,
                    stop.status,
                )
                message = {"rule": rule.name, "reason": stop.reason, "status": stop.status}
                event = json.dumps({**message, **stop.detail})
                trainer.recorder.event(events.EARLY_STOP, event, step=record["step"])
                return
