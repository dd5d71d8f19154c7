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
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.ledger.store import Ledger, OpenPhase
from ledgerlm.report.sinks import SinkSet, failure_line
from ledgerlm.train.record import Recorder


class LedgerRecorder(Recorder):
    """Writes what the trainer reports into ``ledger`` for ``run_id``.

    Every optimizer update becomes a ``steps`` row (tokens and targets of that update,
    loss, grad norm, lr, its seconds: since the previous update ended, evaluations and
    checkpoints apart, and when it ended), buffered and written once per ``flush_every``
    updates. Each write is also the heartbeat of the open phase (``Ledger.beat``), so a
    process killed mid-segment leaves the last time it was known alive. The buffer is therefore
    also written at the first update of each newly opened phase and whenever
    ``flush_seconds`` passed since the last write: with evaluations cutting training
    into segments every ``flush_every`` updates, a count alone would beat each segment
    only just before it ends normally, never while it could be killed.

    ``note`` receives the lines the user should see while the run goes on (where a sink's
    copy goes, a sink that failed); by default nobody.
    """

    def __init__(
        self,
        ledger: Ledger,
        run_id: str,
        flush_every: int = 1,
        flush_seconds: float = 2.0,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.ledger, self.run_id = ledger, run_id
        self._note = note
        self.clock = PhaseClock(ledger, run_id)
        self.flush_every = max(1, flush_every)
        self.flush_seconds = flush_seconds
        self.rows: list[dict[str, Any]] = []
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
        s = trainer.state
        self._last = (s.step, s.tokens, s.targets)
        self._flushed_at = time.monotonic()
        self._step_began = time.perf_counter()

    def on_step_end(self, trainer: Any) -> None:
        s = trainer.state
        step, tokens, targets = self._last
        if s.step == step:  # no update happened (a skipped step)
            return
        now = time.perf_counter()
        seconds, self._step_began = now - self._step_began, now
        self.rows.append(
            {
                "step": s.step,
                "tokens": s.tokens - tokens,
                "targets": s.targets - targets,
                "loss": s.loss,
                "grad_norm": s.grad_norm,
                "lr": s.lr,
                "seconds": seconds,  # since the previous update ended (evaluations apart)
                "at": time.time(),  # when it ended: the wall time every sink stamps it with
            }
        )
        self._last = (s.step, s.tokens, s.targets)
        if len(self.rows) >= self.flush_every or self._beat_due():
            self.flush(trainer)

    def _beat_due(self) -> bool:
        phase = self.clock.current
        if phase is None:
            return False
        late = time.monotonic() - self._flushed_at >= self.flush_seconds
        return late or phase.id != self._beaten

    def flush(self, trainer: Any = None) -> None:
        """Write the buffered rows, then beat the open phase up to their last step."""
        if self.rows:
            self.ledger.add_steps(self.run_id, self.rows)
            phase = self.clock.current
            if phase is not None:
                self.ledger.beat(phase.id, step=int(self.rows[-1]["step"]))
                self._beaten = phase.id
            self.sinks.log_steps(self.rows)  # what the ledger now holds, never more
        self.rows = []
        self._flushed_at = time.monotonic()

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
        self.ledger.add_event(self.run_id, "sink_failed", line, step=step)
        at = f" at step {step}" if step else ""
        dest = " DIR" if name == "tensorboard" else ""
        self.note(
            f"warning: {line}; the {name} sink is dropped{at}, the ledger keeps every point "
            f"(ledgerlm ledger export {self.run_id} --to {name}{dest} copies them)"
        )

    def close(self) -> None:
        """Close the run's sinks, however the run ended: each gets the run's status in the
        ledger, and a ``sinks`` event keeps the seconds each one cost. Never raises: it
        runs while an error may be on its way out."""
        sinks = self.sinks
        if not sinks and not sinks.seconds:
            return
        try:
            status = self.ledger.run_summary(self.run_id)["run"]["status"]
        except Exception:
            status = "failed"  # the ledger cannot say; the run did not end well
        try:
            sinks.close(status)
            spent = {name: round(s, 6) for name, s in sinks.seconds.items()}
            self.ledger.add_event(self.run_id, "sinks", json.dumps({"seconds": spent}))
        except Exception:
            pass  # a ledger that cannot be written: the error in flight says why
        sinks.seconds = {}
