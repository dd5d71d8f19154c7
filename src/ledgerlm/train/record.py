"""The one seam between training and whatever keeps its record.

The trainer, its evaluation and its checkpoints never hold a ledger: they report to a
``Recorder``. Time is reported as sections (``start``/``stop`` a training segment;
``interrupt`` it for an evaluation or a checkpoint), and facts as calls (an update
ended, an evaluation's result, an event such as a non-finite step). This base class
records nothing, which is what a test, a benchmark or a follower rank needs; the lab
builds one that writes the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    """A span of time the recorder keeps; ``detail`` may be filled until it ends.

    ``id`` names the section in the record (``None`` when nothing is recorded), so an
    evaluation can be bound to the section that produced it.
    """

    kind: str
    id: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Receives what training reports; this base class keeps none of it."""

    def start(self, kind: str, step: int | None = None, **detail: Any) -> Any:
        """Open a section of ``kind`` at ``step`` (with ``detail``), ending the open one."""
        return Section(kind, None, dict(detail))

    def stop(self, step: int | None = None) -> None:
        """End the open section (if any) at ``step``."""

    @contextmanager
    def interrupt(self, kind: str, step: int | None = None, **detail: Any) -> Iterator[Section]:
        """Pause the open section for a section of ``kind``, then reopen the paused kind."""
        yield Section(kind, None, dict(detail))

    def on_train_start(self, trainer: Any) -> None:
        """Training (re)starts at ``trainer.state``."""

    def on_step_end(self, trainer: Any) -> None:
        """An optimizer update was applied; ``trainer.state`` holds its figures."""

    def on_train_end(self, trainer: Any) -> None:
        """Training stops; what is buffered must be kept now."""
        self.flush(trainer)

    def flush(self, trainer: Any) -> None:
        """Keep what is buffered (called before a checkpoint, so the record leads it)."""

    def evaluation(
        self, record: dict[str, Any], section: Section, counters: dict[str, float]
    ) -> None:
        """An evaluation's result, bound to the ``section`` it was made in."""

    def counters(self, values: dict[str, float]) -> None:
        """The run's counters as they stand (tokens, targets, updates, ...)."""

    def event(self, kind: str, message: str, step: int | None = None) -> None:
        """Something that happened at ``step`` (JSON or text ``message``)."""

    def note(self, line: str) -> None:
        """A line the user should read while the run goes on (a loss spike's warning)."""
