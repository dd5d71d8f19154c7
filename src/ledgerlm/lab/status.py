"""Whether a run the ledger calls ``running`` still has a process training it.

A training process holds an exclusive lock on ``runs/<id>/.lock`` for as long as it
lives (the kernel drops it when the process dies, ``kill -9`` included). A run marked
``running`` whose lock nobody holds was interrupted: its process died before it could
mark the run failed. ``ledger list`` and ``ledger show`` call it ``interrupted``, with
its last heartbeat, and ``ledgerlm resume`` continues it (or restarts it, when it died
before its first checkpoint).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from ledgerlm.workspace import Workspace

LOCK = ".lock"
GRACE_SECONDS = 60.0  # a run this young may not have taken its lock yet


def lock_held(run_dir: Path) -> bool | None:
    """True when a live process holds the run's lock, False when none does, None when
    there is no lock file (the run never reached its folder)."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def interrupted(workspace: Workspace, run: dict[str, Any], now: float | None = None) -> bool:
    """A ``running`` run with no live process (see the module doc)."""
    if run["status"] != "running":
        return False
    try:
        held = lock_held(workspace.run_dir(run["id"]))
    except ValueError:  # an id that names no folder of this workspace
        return False
    if held is None:
        age = (now or time.time()) - float(run.get("created_at") or 0.0)
        return age > GRACE_SECONDS
    return not held


def with_liveness(workspace: Workspace, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` (rows of ``Ledger.list_runs`` or a summary's ``run``) with ``status``
    ``interrupted`` where no process trains a ``running`` run any more."""
    now = time.time()
    return [{**r, "status": "interrupted"} if interrupted(workspace, r, now) else r for r in runs]
