"""The training loop: accumulation with one global denominator, clipping, a
non-finite guard, loss spikes, and callbacks for everything else (evaluation, progress,
budget).
What it spends and measures goes to one ``Recorder`` (the ledger, when the lab runs it).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import torch
from torch.profiler import record_function

from ledgerlm.config import TrainConfig
from ledgerlm.ledger import events
from ledgerlm.model.dtensor import is_sharded
from ledgerlm.tokens.packing import Batch
from ledgerlm.train.distributed import World
from ledgerlm.train.loss import NoTargetsError, objective_denominator, objective_weights
from ledgerlm.train.optim import Optimizer, lr_factor, schedule_position
from ledgerlm.train.parallelize import parallelize
from ledgerlm.train.record import Recorder
from ledgerlm.train.spikes import SpikeDetector


class NonFiniteLossError(FloatingPointError):
    """A NaN or infinite loss or gradient never passes silently."""


@dataclass
class StepRecord:
    """What one optimizer step saw; a skipped step keeps the data it consumed."""

    step: int
    loss: float
    grad_norm: float  # before clipping
    lr: float
    tokens: int
    targets: int
    denominator: int
    skipped: bool = False


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    tokens: int = 0  # real (non-padding) input tokens consumed, skipped steps included
    targets: int = 0  # supervised targets trained on (applied updates only)
    rows: int = 0
    loss: float = math.nan  # objective of the last update (global numerator / denominator)
    grad_norm: float = math.nan  # before clipping
    lr: float = 0.0  # lr of the first parameter group at the last update
    step_tokens: int = 0  # tokens of the last update
    step_targets: int = 0  # supervised targets of the last update
    denominator: int = 0  # the objective's global denominator of the last update
    # updates dropped: non-finite under nonfinite = "skip", spikes under on_spike = "skip"
    skipped_steps: int = 0
    # input tokens consumed per domain (all ranks, skipped steps included), when the
    # stream counts them: their sum is ``tokens``
    domain_tokens: dict[str, int] = field(default_factory=dict)
    history: list[StepRecord] = field(default_factory=list)
    should_stop: bool = False
    stop_reason: str = ""
    stop_status: str = ""  # a stop rule's status ("not reached", "pruned"); "" otherwise

    def counters(self) -> dict[str, float]:
        return {
            "optimizer_updates": self.step,
            "tokens": self.tokens,
            "supervised_targets": self.targets,
            "rows": self.rows,
            "skipped_updates": self.skipped_steps,
            **{f"tokens/{d}": n for d, n in self.domain_tokens.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, history included: a resumed run must continue the same record."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        history = [StepRecord(**r) for r in d.get("history", [])]
        return cls(**{**d, "history": history})


class Callback(Protocol):
    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_step_end(self, trainer: Trainer) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...


def _number(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclass
class _Unread:
    """An update whose loss and grad norm are on their way to the host buffer."""

    record: StepRecord
    ready: Any = None  # torch.cuda.Event: the copy is done
    micro: list[Batch] = field(default_factory=list)
    placed: list[Any] = field(default_factory=list)
    before: dict[str, Any] | None = None  # the state before it, to undo it on the host


def _host_array(t: torch.Tensor) -> np.ndarray:
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _host_counts(mb: Batch, objective: str, empty_rows: str) -> tuple[int, int, int]:
    """(supervised targets, objective denominator, real tokens) of a host micro-batch,
    read through numpy views of its tensors: nothing waits for the device."""
    mask = _host_array(mb.loss_mask)
    return (
        int(np.count_nonzero(mask)),
        objective_denominator(mask, objective, empty_rows),
        int(np.count_nonzero(_host_array(mb.valid))),
    )


def describe_batches(micro: Sequence[Batch]) -> dict[str, Any]:
    """Which data a step saw: enough to find and replay the offending rows."""
    domains = sorted({int(d) for mb in micro for d in mb.target_domains[mb.loss_mask].tolist()})
    segments = torch.cat([mb.doc_ids[mb.doc_ids >= 0] for mb in micro])
    return {
        "rows": sum(mb.input_ids.shape[0] for mb in micro),
        "targets": sum(mb.num_targets for mb in micro),
        "target_domains": domains,
        "segments": [int(segments.min()), int(segments.max())] if segments.numel() else [],
    }


class Trainer:
    """Runs optimizer updates until ``max_steps`` or until a callback asks to stop.

    Under ``torchrun`` every rank runs a Trainer over its own share of the batches
    (``world``); counts, the loss and gradients are summed over ranks, so the update
    is the one a single process would make on all ranks' micro-batches.

    Under ``nonfinite = "skip"`` a run of ``max_consecutive_skips`` non-finite
    steps still stops it: a model that is broken for good must not loop forever.

    An update whose loss exceeds ``spike_factor`` x the median loss of the previous
    updates is a ``loss_spike`` event (and a warning line); under ``on_spike = "skip"``
    it is dropped as a non-finite one is. The loss is the global update's (all
    micro-batches, all ranks), so every rank makes the same decision without talking.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Optimizer,
        cfg: TrainConfig,
        batches: Iterator[Batch],
        attention: str,
        callbacks: Sequence[Callback] = (),
        recorder: Recorder | None = None,
        max_consecutive_skips: int = 100,
        world: World | None = None,
        engine: torch.nn.Module | None = None,
    ) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.world = world or World()
        self.batches, self.attention = batches, attention
        self.callbacks = list(callbacks)
        self.recorder = recorder or Recorder()
        self.state = TrainState()
        self.events: list[dict[str, Any]] = []
        self.max_consecutive_skips = max_consecutive_skips
        self._consecutive_skips = 0
        self._unread: _Unread | None = None  # the applied update whose values are unread
        self._failed: _Unread | None = None  # read non-finite, raised at the next check
        self._host: torch.Tensor | None = None  # (loss, grad norm), pinned on CUDA
        self.spikes = SpikeDetector(cfg.spike_factor, cfg.spike_warmup)
        if self.world.distributed and self.world.parallel == "none":
            raise ValueError(
                f"{self.world.size} ranks need a data-parallel engine: World.placed(...)"
            )
        # What the step calls: the model as the one parallelize step left it (compiled
        # block by block, sharded, or inside DDP, which sums gradients over ranks while
        # the backward pass runs). The lab passes it; a caller who passes none has it
        # parallelized here, unless its model is sharded already (then it is called as
        # it is). A model to shard cannot be: FSDP replaces the parameters, so it shards
        # before the optimizer is built.
        if engine is None and self.world.sharded:
            if not is_sharded(next(self.model.parameters())):
                raise ValueError(
                    "a sharded model is parallelized before its optimizer is built: "
                    "pass the engine train.parallelize.parallelize returned"
                )
            engine = self.model
        self.engine = engine if engine is not None else parallelize(self.model, self.world, cfg)
        for group in self.optimizer.param_groups:  # a plain optimizer's lr is its peak
            group.setdefault("base_lr", group["lr"])

    def autocast(self) -> torch.autocast:
        """The numerics of every forward: bf16 autocast under ``precision = "bf16"``.

        Weights, gradients and optimizer state stay fp32 either way (the loss upcasts
        low-precision logits). Callbacks run inside it too, so evaluation scores the
        model with the numerics it trains with.
        """
        bf16 = self.cfg.precision == "bf16"
        return torch.autocast(self.world.device.type, dtype=torch.bfloat16, enabled=bf16)

    def train_step(self) -> float:
        """One optimizer update over ``grad_accum`` micro-batches on every rank, its loss
        and gradient norm read before its optimizer step (one host synchronisation), as a
        caller that wants the loss back needs. ``fit`` reads them one update later (see
        ``settle``). Returns the step's loss (NaN/inf for a skipped step)."""
        record = self._update(read_now=True)
        return record.loss

    def update(self) -> StepRecord:
        """One update as ``fit`` makes it: its loss and grad norm are read by the next
        update (or ``settle``), unless a skip policy needs them before the optimizer step.
        What a benchmark of the step loop times; ``train_step`` waits for the device."""
        return self._update(read_now=self.reads_at_once)

    def _update(self, read_now: bool) -> StepRecord:
        """One optimizer update over ``grad_accum`` micro-batches on every rank.

        The step's denominator depends only on the label masks, so it is summed
        (over micro-batches and ranks) before any forward, from the host batches (no
        device round trip); each micro-batch then backpropagates its numerator / that
        global denominator, gradients are summed over ranks, and the update equals that
        of one big batch whatever the split.

        The loss and the gradient norm stay on the device, copied (non-blocking on CUDA)
        into a host buffer. ``read_now`` reads them before the optimizer step, as a skip
        policy needs; otherwise the update is applied and its values are read by the
        next update, after that one's forward and backward are queued (``settle``).
        """
        cfg, s, world = self.cfg, self.state, self.world
        micro: list[Batch] = []
        placed: list[Any] = []  # the documents of the update (every rank's), when known
        for _ in range(cfg.grad_accum):
            micro.append(next(self.batches))
            placed += getattr(self.batches, "last_documents", ())
        step = s.step + 1
        terms = (cfg.objective, cfg.empty_rows)
        local = [_host_counts(mb, *terms) for mb in micro]  # (targets, denominator, tokens)
        n_targets, denominator, tokens, rows = (
            int(x)
            for x in world.all_reduce(  # host values over gloo: no device round trip
                [
                    sum(c[0] for c in local),
                    sum(c[1] for c in local),
                    sum(c[2] for c in local),
                    sum(mb.input_ids.shape[0] for mb in micro),
                ],
                torch.float64,  # exact for counts below 2**53
            )
        )
        if n_targets == 0 or denominator == 0:
            raise NoTargetsError(f"step {step}: no supervised targets")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=world.device)
        last = len(micro) - 1
        for i, mb in enumerate(micro):
            # One process may skip a micro-batch without targets (it adds 0 to the
            # numerator; its rows are counted); an engine must run on every rank alike.
            if local[i][0] == 0 and world.parallel == "none":
                continue
            mb = world.to_device(mb)
            # Named ranges (``trainer.*``) let a profile say where a step goes; they cost
            # nothing measurable when no profiler is running.
            with self._sync(i == last), self.autocast():  # backward reuses the dtypes
                with record_function("trainer.mask"):  # once per micro-batch, all layers
                    mask = self.model.attention_spec(mb.doc_ids, self.attention)
                with record_function("trainer.forward"):
                    # The model scores its head itself (GPT.forward with targets): the
                    # numerator, weighted by the objective, without the (B, T, V) logits.
                    weights = objective_weights(mb.loss_mask, *terms, dtype=torch.float64)
                    numerator = self.engine(
                        mb.input_ids, mb.position_ids, mask, targets=mb.targets, weights=weights
                    )
            with self._sync(i == last), record_function("trainer.backward"):
                (numerator / denominator).backward()
            total += numerator.detach().double()
        # The previous update's values: its work is done, or queued before this one's.
        self.settle()
        self._raise_if_failed()
        if world.distributed:  # the numerator summed over ranks on the device
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
        with record_function("trainer.clip"):
            norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), cfg.grad_clip or math.inf
            )
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a sharded norm
        factor = lr_factor(schedule_position(cfg, step, s.tokens), cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
        lr = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer.param_groups else 0.0
        record = StepRecord(
            step=step,
            loss=math.nan,  # read from the device by ``settle``
            grad_norm=math.nan,
            lr=lr,
            tokens=tokens,
            targets=n_targets,
            denominator=denominator,
        )
        unread = self._copy_out(torch.stack([total / denominator, norm.double()]), record)
        unread.micro, unread.placed = micro, placed
        if read_now:
            self._read(unread)
            finite = math.isfinite(record.loss) and math.isfinite(record.grad_norm)
            if not finite:
                self._non_finite(record, micro, placed)
            elif self._spike(record, micro, placed) and cfg.on_spike == "skip":
                self._drop(record)
            else:
                self._consecutive_skips = 0
                self.optimizer.step()
                self._commit(record)
                s.loss, s.grad_norm = record.loss, record.grad_norm
        else:  # applied now, read by the next update; undone on the host if non-finite
            unread.before = {
                f.name: copy.copy(getattr(s, f.name)) for f in fields(s) if f.name != "history"
            }
            self.optimizer.step()
            self._commit(record)
            self._unread = unread
        s.tokens += record.tokens
        s.rows += rows
        if hasattr(self.batches, "consumed_by_domain"):
            s.domain_tokens = self.batches.consumed_by_domain()
        s.history.append(record)
        return record

    def _commit(self, record: StepRecord) -> None:
        s = self.state
        s.step, s.lr = record.step, record.lr
        s.step_tokens, s.step_targets, s.denominator = (
            record.tokens,
            record.targets,
            record.denominator,
        )
        s.targets += record.targets

    @property
    def reads_at_once(self) -> bool:
        """Whether ``fit`` reads each update's loss before its optimizer step: only a skip
        policy needs it (whether the update is applied depends on the loss)."""
        spikes_skip = self.cfg.on_spike == "skip" and self.cfg.spike_factor > 0
        return self.cfg.nonfinite == "skip" or spikes_skip

    @property
    def unread(self) -> StepRecord | None:
        """The applied update whose loss and gradient norm are not read yet, if any."""
        return None if self._unread is None else self._unread.record

    def _copy_out(self, values: torch.Tensor, record: StepRecord) -> _Unread:
        """The update's (loss, grad norm) into the host buffer: on CUDA a non-blocking
        copy into pinned memory and an event, so the host goes on queueing work."""
        if self._host is None:
            self._host = torch.empty(2, dtype=torch.float64, pin_memory=values.is_cuda)
        self._host.copy_(values.detach(), non_blocking=values.is_cuda)
        ready = None
        if values.is_cuda:
            ready = torch.cuda.Event()
            ready.record()
        return _Unread(record, ready)

    def _read(self, unread: _Unread) -> None:
        """Fill the record from the host buffer (waiting for its copy on CUDA)."""
        if unread.ready is not None:
            unread.ready.synchronize()
        assert self._host is not None
        loss, grad_norm = self._host.numpy().tolist()  # host memory: no device access
        unread.record.loss, unread.record.grad_norm = loss, grad_norm

    def settle(self) -> None:
        """Read the last applied update's loss and gradient norm, if not read yet.

        The next update calls it once its forward and backward are queued, so on CUDA
        the copy waited for is long done (or queued before the device's current work);
        whoever needs the values sooner (a ledger flush, a checkpoint, the end of
        training) calls it too. A finite update is then looked at for a spike (recorded,
        ``on_spike = "record"``); a non-finite one is undone on the host and raised at
        the next point every rank reaches alike (``_raise_if_failed``), never here, so a
        rank that settles sooner (rank 0's ledger) does not leave the others behind.
        """
        unread, self._unread = self._unread, None
        if unread is None:
            return
        self._read(unread)
        record, s = unread.record, self.state
        if not (math.isfinite(record.loss) and math.isfinite(record.grad_norm)):
            self._failed = unread
            return
        self._consecutive_skips = 0
        s.loss, s.grad_norm = record.loss, record.grad_norm
        self._spike(record, unread.micro, unread.placed)

    def _raise_if_failed(self) -> None:
        """A non-finite update read late: the state goes back to before it (as if it
        was never applied, the weights apart), then its event is recorded and raised."""
        unread, self._failed = self._failed, None
        if unread is None:
            return
        s = self.state
        for name, value in (unread.before or {}).items():
            setattr(s, name, value)
        s.history = [r for r in s.history if r is not unread.record]
        self._non_finite(unread.record, unread.micro, unread.placed)

    def _sync(self, last: bool) -> AbstractContextManager[Any]:
        """Gradients are summed over ranks once per update, in the last micro-batch's
        backward; the others accumulate locally (DDP's ``no_sync``; FSDP's
        ``set_requires_gradient_sync``, which holds the unsharded gradients until then)."""
        if self.world.parallel == "fsdp":
            self.engine.set_requires_gradient_sync(last)  # type: ignore[operator]
            return nullcontext()
        if last or self.world.parallel != "ddp":
            return nullcontext()
        return self.engine.no_sync()  # type: ignore[operator]

    def _describe(self, micro: Sequence[Batch], placed: Sequence[Any]) -> dict[str, Any]:
        """The update's data: this rank's micro-batches, and the documents and domains of
        the whole update when the stream names them."""
        out = describe_batches(micro)
        describe = getattr(self.batches, "describe_documents", None)
        if describe is not None and placed:
            out.update(describe(placed))
        return out

    def _spike(self, record: StepRecord, micro: Sequence[Batch], placed: Sequence[Any]) -> bool:
        """Whether the update's loss is a spike; if so, log the step and its data."""
        window = len(self.spikes)  # the losses the median is of
        median = self.spikes.observe(record.loss)
        if median is None:
            return False
        policy = self.cfg.on_spike
        event = {
            "kind": "loss_spike",
            "step": record.step,
            "loss": record.loss,
            "median": median,
            "factor": self.cfg.spike_factor,
            "window": window,
            "policy": policy,
            **self._describe(micro, placed),
        }
        self.events.append(event)
        self.recorder.event(events.LOSS_SPIKE, json.dumps(event), step=record.step)
        self.recorder.note(
            f"warning: loss spike at step {record.step}: loss {record.loss:.4g} is "
            f"{record.loss / median:.3g}x the median {median:.4g} of the previous "
            f"{window} updates (train.spike_factor = {self.cfg.spike_factor:g}); "
            + ("the update is skipped" if policy == "skip" else "the update is applied")
        )
        return True

    def _non_finite(
        self, record: StepRecord, micro: Sequence[Batch], placed: Sequence[Any]
    ) -> None:
        """Log the step and its data, then stop, or drop the update and move on."""
        event = {
            "kind": "nonfinite",
            "step": record.step,
            "loss": _number(record.loss),
            "grad_norm": _number(record.grad_norm),
            "policy": self.cfg.nonfinite,
            **self._describe(micro, placed),
        }
        self.events.append(event)
        message = json.dumps(event)
        self.recorder.event(events.NONFINITE, message, step=record.step)
        self._consecutive_skips += 1
        if self.cfg.nonfinite == "stop":
            raise NonFiniteLossError(f"step {record.step}: non-finite values: {message}")
        if self._consecutive_skips >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f"step {record.step}: {self._consecutive_skips} non-finite steps in a row: "
                + message
            )
        self._drop(record)

    def _drop(self, record: StepRecord) -> None:
        """No optimizer step for this update: its gradients go, its data stays consumed."""
        self.optimizer.zero_grad(set_to_none=True)
        record.skipped = True
        self.state.skipped_steps += 1

    def state_dict(self) -> dict[str, Any]:
        """Trainer state a resume needs beyond weights, optimizer and data cursor (the
        last update's values read first: a non-finite one raises before any is saved)."""
        self.settle()
        self._raise_if_failed()
        return {
            "state": self.state.to_dict(),
            "events": self.events,
            "consecutive_skips": self._consecutive_skips,
            "spikes": self.spikes.state_dict(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.state = TrainState.from_dict(d["state"])
        self._unread = self._failed = None
        self.events = list(d.get("events", []))
        self._consecutive_skips = int(d.get("consecutive_skips", 0))
        self.spikes.load_state_dict(d.get("spikes", {}))

    def fit(self) -> TrainState:
        recorder = self.recorder
        recorder.start("train", self.state.step)
        try:
            with self.autocast():
                recorder.on_train_start(self)
                for cb in self.callbacks:
                    cb.on_train_start(self)
            while self.state.step < self.cfg.max_steps and not self.state.should_stop:
                before = self.state.step
                self.update()
                if self.state.step == before:  # skipped: nothing new to evaluate or report
                    continue
                with self.autocast():
                    recorder.on_step_end(self)
                    for cb in self.callbacks:
                        cb.on_step_end(self)
            self.settle()
            self._raise_if_failed()
            if not self.state.stop_reason:
                self.state.stop_reason = "max_steps"
            with self.autocast():
                recorder.on_train_end(self)
                for cb in self.callbacks:
                    cb.on_train_end(self)
        finally:
            recorder.stop(self.state.step)
        return self.state
