"""The ledger behind a run: phases, per-update rows, evaluations and events, all written
through one ``LedgerRecorder`` that the trainer reports to (``train.record.Recorder``).

The lab also drives it for the phases around training (setup, prep, tokenize, restore,
the final checkpoint and test), so one ``PhaseClock`` opens every phase of a process and
each phase starts where the previous one ended: the phases cover the run's wall time.

The recorder also feeds the run's sinks (``report.sinks``: TensorBoard, MLflow, W&B;
opened by ``lab.sinks.open_sinks``): each per-update row once it is in the ledger, each
evaluation once it is recorded. A sink that fails is written down as a ``sink_failed``
event, said once to the user (``note``: the console, through the command's progress),
and dropped; training goes on.

A ledger held by another process (a backup, a notebook inside a transaction) never stops
training: per-update rows wait in memory (at most ``MAX_ROWS``) and are written once it
is free; a phase change, an evaluation or an event waits for it, the ledger retrying
with backoff for its patience (``log.ledger_timeout``), and past that ``LedgerBusyError``
reaches the lab, which checkpoints the run before marking it failed. Each wait is said
on the console.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ledgerlm.ledger import events
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.ledger.store import Ledger, LedgerBusyError, OpenPhase
from ledgerlm.report.sinks import SinkSet, failure_line, final_scalars
from ledgerlm.train.record import Recorder

MAX_ROWS = 100_000  # per-update rows kept in memory while the ledger is held
NOTE_EVERY = 60.0  # seconds between two lines saying training waits for the ledger


class LedgerRecorder(Recorder):
    """Writes what the trainer reports into ``ledger`` for ``run_id``.

    Every optimizer update becomes a ``steps`` row (tokens and targets of that update,
    loss, grad norm, lr, its seconds: since the previous update ended, evaluations and
    checkpoints apart, and when it ended), buffered and written once per ``flush_every``
    updates. A row's loss and grad norm are the trainer's once it has read them
    (``Trainer.unread``: the next update reads them, or a flush does, ``settle``), so
    only a flush waits for the device. Each write is also the heartbeat of the open
    phase (``Ledger.beat``), so a process killed mid-segment leaves the last time it
    was known alive. The buffer is therefore also written at the first update of each
    newly opened phase and whenever ``flush_seconds`` passed since the last write: with
    evaluations cutting training into segments every ``flush_every`` updates, a count
    alone would beat each segment only just before it ends normally, never while it
    could be killed.

    While another process holds the ledger, the rows wait in memory and training goes
    on; at ``max_rows`` of them training waits for the ledger (see the module doc).

    ``note`` receives the lines the user should see while the run goes on (where a sink's
    copy goes, a sink that failed, a ledger held by another process); by default nobody.
    """

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        flush_every: int = 1,
        flush_seconds: float = 2.0,
        note: Callable[[str], None] | None = None,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.ledger, self.run_id = ledger, run_id
        self._note = note
        self.max_rows = max(1, max_rows)
        self._held_since: float | None = None  # when the ledger first refused the rows
        self._waits_said = -NOTE_EVERY  # when training last said it waits for the ledger
        ledger.on_busy = self._waiting
        self.clock = PhaseClock(ledger, run_id)
        self.flush_every = max(1, flush_every)
        self.flush_seconds = flush_seconds
        self.rows: list[dict[str, Any]] = []
        # the latest update's row while the trainer has not read its loss (Trainer.unread)
        self._unread_row: tuple[dict[str, Any], Any] | None = None
        self._trainer: Any = None
        self._last = (0, 0, 0)  # step, tokens, targets at the previous row
        self._flushed_at = time.monotonic()
        self._beaten: int | None = None  # id of the phase the last write beat
        self._step_began = time.perf_counter()  # when the update being made began
        self.sinks = SinkSet(on_failure=self.sink_failed)  # none until open_sinks

    # -- phases -------------------------------------------------------------------------

    @property
    def current(self) -> OpenPhase | None:
        return self.clock.current

    def start(self, kind: str, step: int | None = None, **detail: Any) -> OpenPhase:
        return self.clock.start(kind, step, **detail)

    def stop(self, step: int | None = None) -> None:
        self.clock.stop(step)

    @contextmanager
    def interrupt(self, kind: str, step: int | None = None, **detail: Any) -> Iterator[OpenPhase]:
        with self.clock.interrupt(kind, step, **detail) as phase:
            yield phase
        self._step_began = time.perf_counter()  # an update's time holds no evaluation

    # -- per-update rows and heartbeats -------------------------------------------------

    def on_train_start(self, trainer: Any) -> None:
        self._trainer = trainer
        s = trainer.state
        self._last = (s.step, s.tokens, s.targets)
        self._flushed_at = time.monotonic()
        self._step_began = time.perf_counter()

    def on_step_end(self, trainer: Any) -> None:
        self._take_unread_row(trainer)
        s = trainer.state
        step, tokens, targets = self._last
        if s.step == step:  # no update happened (a skipped step)
            return
        now = time.perf_counter()
        seconds, self._step_began = now - self._step_began, now
        row = {
            "step": s.step,
            "tokens": s.tokens - tokens,
            "targets": s.targets - targets,
            "loss": s.loss,
            "grad_norm": s.grad_norm,
            "lr": s.lr,
            "seconds": seconds,  # since the previous update ended (evaluations apart)
            "at": time.time(),  # when it ended: the wall time every sink stamps it with
        }
        record = getattr(trainer, "unread", None)
        if record is not None and record.step == s.step:
            self._unread_row = (row, record)  # its loss is read by the next update or a flush
        else:
            self.rows.append(row)
        self._last = (s.step, s.tokens, s.targets)
        if len(self.rows) + (self._unread_row is not None) >= self.flush_every or self._beat_due():
            self.flush(trainer, wait=len(self.rows) >= self.max_rows)

    def unwritten(self, trainer: Any) -> list[dict[str, Any]]:
        """The per-update rows the ledger has not taken, the one whose loss the trainer
        has not read yet included (read now, as a flush reads it)."""
        if self._unread_row is not None:
            trainer.settle()
            self._take_unread_row(trainer)
        return self.rows

    def _take_unread_row(self, trainer: Any) -> None:
        """The held row joins the buffer once the trainer read its update's loss and
        grad norm; a non-finite update (undone by the trainer, which raises) never does."""
        if self._unread_row is None:
            return
        row, record = self._unread_row
        if getattr(trainer, "unread", None) is record:
            return
        self._unread_row = None
        if math.isfinite(record.loss) and math.isfinite(record.grad_norm):
            row["loss"], row["grad_norm"] = record.loss, record.grad_norm
            self.rows.append(row)

    def _beat_due(self) -> bool:
        phase = self.clock.current
        if phase is None:
            return False
        late = time.monotonic() - self._flushed_at >= self.flush_seconds
        return late or phase.id != self._beaten

    def flush(self, trainer: Any = None, wait: bool = True) -> None:
        """Write the buffered rows and beat the open phase up to their last step (one
        transaction). Without ``wait``, a ledger another process holds keeps them in
        memory and training goes on; with it (before a checkpoint, at the end, with
        ``max_rows`` buffered) training waits for the ledger, up to its patience.

        A row whose loss the trainer has not read yet is read first (``settle``: on CUDA
        the host waits for that update's copy): a flush is where the step loop syncs."""
        trainer = trainer if trainer is not None else self._trainer
        if self._unread_row is not None and trainer is not None:
            trainer.settle()
            self._take_unread_row(trainer)
        if self.rows:
            phase = self.clock.current
            beat = None if phase is None else phase.id
            try:
                if wait:
                    if len(self.rows) >= self.max_rows and self._held_since is not None:
                        self.note(
                            f"warning: {len(self.rows):,} updates wait for {self.ledger.path}: "
                            "training waits for it"
                        )
                    self.ledger.add_steps(self.run_id, self.rows, beat=beat)
                else:
                    with self.ledger.waiting_at_most(0):
                        self.ledger.add_steps(self.run_id, self.rows, beat=beat)
            except LedgerBusyError:
                if wait:
                    raise
                self._held()
                self._flushed_at = time.monotonic()  # tried again in flush_seconds
                return
            self._beaten = beat
            self._released()
            self.sinks.log_steps(self.rows)  # what the ledger now holds, never more
        self.rows = []
        self._flushed_at = time.monotonic()

    # -- a ledger held by another process -----------------------------------------------

    def _held(self) -> None:
        if self._held_since is None:
            self._held_since = time.monotonic()
            self.note(
                f"warning: {self.ledger.path} is locked by another process; training goes "
                f"on, its per-update rows kept in memory until the ledger is free (up to "
                f"{self.max_rows:,}, then training waits for it)"
            )

    def _released(self) -> None:
        if self._held_since is not None:
            held = time.monotonic() - self._held_since
            self._held_since = None
            self.note(
                f"{self.ledger.path} is free again after {held:,.1f} s: "
                f"{len(self.rows):,} buffered updates written"
            )

    def _waiting(self, waited: float) -> None:
        """The ledger retries a statement another process's lock holds back."""
        now = time.monotonic()
        if waited >= 1.0 and now - self._waits_said >= NOTE_EVERY:
            self._waits_said = now
            self.note(
                f"warning: {self.ledger.path} is locked by another process: training waits "
                f"for it ({waited:,.0f} s so far, at most {self.ledger.patience:,.0f} s: "
                "log.ledger_timeout)"
            )

    # -- facts --------------------------------------------------------------------------

    def evaluation(self, record: dict[str, Any], section: Any, counters: dict[str, float]) -> None:
        self.ledger.add_evaluation(self.run_id, phase_id=section.id, **record)
        self.ledger.set_counters(self.run_id, counters)
        self.sinks.log_evaluation(record)

    def counters(self, values: dict[str, float]) -> None:
        self.ledger.set_counters(self.run_id, values)

    def event(self, kind: str, message: str, step: int | None = None) -> None:
        self.ledger.add_event(self.run_id, kind, message, step=step)

    def note(self, line: str) -> None:
        """Say ``line`` to the user now (the command's progress prints it), if anyone
        listens."""
        if self._note is not None:
            self._note(line)

    # -- sinks --------------------------------------------------------------------------

    def sink_failed(self, name: str, exc: Exception) -> None:
        """A sink raised: one line in the ledger and one warning to the user (the sink is
        dropped by ``SinkSet``)."""
        step = self._last[0] or None
        line = failure_line(name, exc)
        self.ledger.add_event(self.run_id, events.SINK_FAILED, line, step=step)
        at = f" at step {step}" if step else ""
        dest = " DIR" if name == "tensorboard" else ""
        self.note(
            f"warning: {line}; the {name} sink is dropped{at}, the ledger keeps every point "
            f"(ledgerlm ledger export {self.run_id} --to {name}{dest} copies them)"
        )

    def close(self) -> None:
        """Close the run's sinks, however the run ended: each gets the run's final wall
        and device seconds (``report.sinks.final_scalars``) and its status in the
        ledger, and a ``sinks`` event keeps the seconds each one cost. Never raises: it
        runs while an error may be on its way out."""
        sinks = self.sinks
        if not sinks and not sinks.seconds:
            return
        final = None
        try:
            summary = self.ledger.run_summary(self.run_id)
            status, final = summary["run"]["status"], final_scalars(summary)
        except Exception:
            status = "failed"  # the ledger cannot say; the run did not end well
        try:
            sinks.close(status, final)
            spent = {name: round(s, 6) for name, s in sinks.seconds.items()}
            self.ledger.add_event(self.run_id, events.SINKS, json.dumps({"seconds": spent}))
        except Exception:
            pass  # a ledger that cannot be written: the error in flight says why
        sinks.seconds = {}
