"""Phase timers over the ledger: every second of a run belongs to exactly one phase.

Training is recorded as segments between evaluations, so time-to-target can sum
all phases up to the confirming evaluation without estimating anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from ledgerlm.ledger.store import Ledger, OpenPhase


class PhaseClock:
    """Keeps at most one phase open for a run and switches between phases."""

    def __init__(self, ledger: Ledger, run_id: str) -> None:
        self.ledger, self.run_id = ledger, run_id
        self._cm: AbstractContextManager[OpenPhase] | None = None
        self._open: OpenPhase | None = None

    @property
    def current(self) -> OpenPhase | None:
        return self._open

    def start(self, kind: str, step: int | None = None, **detail: Any) -> OpenPhase:
        self.stop(step)
        self._cm = self.ledger.phase(self.run_id, kind, step_start=step, **detail)
        self._open = self._cm.__enter__()
        return self._open

    def stop(self, step: int | None = None) -> None:
        if self._cm is None or self._open is None:
            return
        if step is not None:  # else keep what the holder of the phase set
            self._open.step_end = step
        cm, self._cm, self._open = self._cm, None, None
        cm.__exit__(None, None, None)

    @contextmanager
    def interrupt(self, kind: str, step: int | None = None, **detail: Any) -> Iterator[OpenPhase]:
        """Pause the open phase for ``kind`` (e.g. eval inside train), then resume it."""
        resume = self._open.kind if self._open else None
        phase = self.start(kind, step, **detail)
        try:
            yield phase
        finally:
            self.stop(step)
            if resume is not None:
                self.start(resume, step)
