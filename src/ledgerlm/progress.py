"""Progress reporting that library code can use without knowing about terminals.

Stages call ``progress.task(description, total)`` and advance the returned
handle, and ``progress.note(line)`` for a line the user should read while the work goes
on (a warning, where a copy of the run goes); the CLI passes a rich-backed
implementation, tests pass nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Task(Protocol):
    def advance(self, n: float = 1, **fields: Any) -> None: ...


class Progress(Protocol):
    def task(self, description: str, total: float | None = None) -> Any: ...

    def note(self, line: str) -> None:
        """Show ``line`` (plain text, one line) to the user now."""


class _NullTask:
    def advance(self, n: float = 1, **fields: Any) -> None:
        pass


class NullProgress:
    """The default: report nothing."""

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        yield _NullTask()

    def note(self, line: str) -> None:
        pass


class Named:
    """Progress whose task descriptions and notes carry a name (a sweep's point, a
    study's trial: ``N200k-D100k train``, ``tiny-tune-0a1b2c-t03: ...``)."""

    def __init__(self, progress: Progress, prefix: str) -> None:
        self.progress, self.prefix = progress, prefix

    def task(self, description: str, total: float | None = None) -> Any:
        return self.progress.task(f"{self.prefix} {description}", total)

    def note(self, line: str) -> None:
        self.progress.note(f"{self.prefix}: {line}")
