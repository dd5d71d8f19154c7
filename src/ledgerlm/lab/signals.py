"""How a command's process ends on a signal: SIGTERM and SIGHUP end it as Ctrl-C does.

``signals_as_interrupts()`` (the CLI, around each command) makes SIGINT, SIGTERM and
SIGHUP raise ``KeyboardInterrupt(<signal name>)`` in the main thread, so whatever Ctrl-C
cleans up a ``kill`` (a scheduler's, torchrun's) cleans up too: the temporary checkpoint
folder, the worker pool, the run's ``interrupted`` event and its status (``failing`` in
``lab/skeleton.py``). The exit status is then 128 + the signal's number, as a shell reports a
process the signal ended (130, 143, 129). A signal that was ignored when the command
started (``nohup``) stays ignored.

``undisturbed()`` holds such a signal while a failing run records why it failed: one
that comes meanwhile is dropped, since the process is ending already (most often
torchrun's SIGTERM to the rank that has just seen its peer die).

A signal is what ended the command even when the error that reached the top is another:
``received()`` says which came. torchrun sends SIGTERM to every rank; the rank that
exits first closes its connections, and another, still inside a collective, sees its
peer gone (or DCP wraps the interrupt in an error of its own) before it sees its own
signal. It is then interrupted, not failed by a lost rank.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_held: list[int] = []  # undisturbed() blocks now open
_received: list[str] = []  # the signals that came since signals_as_interrupts() began


def signal_name(exc: KeyboardInterrupt) -> str:
    """The signal a ``KeyboardInterrupt`` stands for (a bare one is Ctrl-C's, SIGINT)."""
    name = str(exc)
    return name if name in {s.name for s in ENDING} else "SIGINT"


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that ended the command."""
    return 128 + int(signal.Signals[signal_name(exc)])


def received() -> KeyboardInterrupt | None:
    """The interrupt standing for the first ending signal this command received, if any."""
    return KeyboardInterrupt(_received[0]) if _received else None


def _interrupt(signum: int, frame: Any) -> None:
    _received.append(signal.Signals(signum).name)
    if not _held:
        raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise ``KeyboardInterrupt`` for the length of the
    block (main thread only: elsewhere Python cannot handle signals); the handlers
    found are restored after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    found = {s: signal.getsignal(s) for s in ENDING}
    for s, handler in found.items():
        if handler in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(s, _interrupt)
    try:
        yield
    finally:
        for s, handler in found.items():
            if signal.getsignal(s) is _interrupt and handler is not None:
                signal.signal(s, handler)


@contextmanager
def undisturbed() -> Iterator[None]:
    """A signal arriving during the block does not interrupt it (see the module doc)."""
    _held.append(1)
    try:
        yield
    finally:
        _held.pop()
