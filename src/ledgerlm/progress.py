"""Progress reporting that library code can use without knowing about terminals.

Stages call ``progress.task(description, total)`` and advance the returned
handle; the CLI passes a rich-backed implementation, tests pass nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Task(Protocol):
    def advance(self, n: float = 1, **fields: Any) -> None: ...


class Progress(Protocol):
    def task(self, description: str, total: float | None = None) -> Any: ...


class _NullTask:
    def advance(self, n: float = 1, **fields: Any) -> None:
        pass


class NullProgress:
    """The default: report nothing."""

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        yield _NullTask()
