"""How much of a run's wall time its phases account for.

A run's bill is the sum of its phases, so every second from the run's creation to the
end of its last phase should lie in one. What does not is reported, in three parts:

- ``uncovered_seconds``: gaps between phases of a live process (work nobody timed);
- ``interrupted_seconds``: the gaps that end at a phase marked ``resume`` (the time
  from a killed or failed process's last known moment to the restore of its resume,
  which is nobody's work and is not charged);
- ``idle_seconds``: the gaps that end at an ``eval_after`` phase (``ledgerlm eval``
  scoring a snapshot of the run after the fact, hours or weeks after its process
  ended): the run was not working then, and nothing of it is charged.

It also places each update in that wall time (``update_times``), for the rows of ledgers
written before each update's end was stored.

Cost: one pass over the run's phases, sorted by start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerlm.ledger.target import EVAL_AFTER


def phase_coverage(created_at: float, phases: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Wall time from ``created_at`` to the end of the last phase, what the phases hold,
    and the uncovered, interrupted and idle gaps (seconds). An open phase counts up to
    its last heartbeat (or its start)."""
    cursor = float(created_at)
    uncovered = interrupted = idle = held = 0.0
    for phase in sorted(phases, key=lambda p: float(p["started_at"])):
        start = float(phase["started_at"])
        if start > cursor:
            if phase.get("kind") == EVAL_AFTER:
                idle += start - cursor
            elif (phase.get("detail") or {}).get("resume"):
                interrupted += start - cursor
            else:
                uncovered += start - cursor
        end = phase["ended_at"] if phase["ended_at"] is not None else phase.get("beat_at")
        end = float(end if end is not None else start)
        held += max(0.0, end - max(start, cursor))
        cursor = max(cursor, end)
    return {
        "wall_seconds": cursor - float(created_at),
        "phase_seconds": held,
        "uncovered_seconds": uncovered,
        "interrupted_seconds": interrupted,
        "idle_seconds": idle,
    }


def update_times(
    rows: Sequence[dict[str, Any]], phases: Sequence[dict[str, Any]]
) -> list[float | None]:
    """When each per-update row (``Ledger.steps``, in step order) ended, in epoch seconds.

    A row's stored ``at`` as it is. A row written before the ledger kept it (schema 4 and
    older) is placed in the train phase holding its step (``step_start < step <=
    step_end``; the latest such phase, as a resumed run's rows are the last process's):
    the phase's start plus the seconds of its updates so far, or, when a row has no
    seconds, its share of the phase's steps; never past the phase's end. None when no
    train phase holds it."""
    trains = [p for p in phases if p["kind"] == "train" and p["step_start"] is not None]
    elapsed: dict[int, float] = {}  # phase id -> seconds of its updates placed so far
    out: list[float | None] = []
    for row in rows:
        if row.get("at") is not None:
            out.append(float(row["at"]))
            continue
        step = int(row["step"])
        holders = [
            p
            for p in trains
            if p["step_start"] < step and (p["step_end"] is None or step <= p["step_end"])
        ]
        if not holders:
            out.append(None)
            continue
        phase = max(holders, key=lambda p: p["id"])
        start = float(phase["started_at"])
        end = phase["ended_at"] if phase["ended_at"] is not None else phase.get("beat_at")
        end = float(end if end is not None else start)
        if row.get("seconds") is not None:
            elapsed[phase["id"]] = elapsed.get(phase["id"], 0.0) + float(row["seconds"])
            at = start + elapsed[phase["id"]]
        else:
            last = phase["step_end"] if phase["step_end"] is not None else step
            at = start + (end - start) * (step - phase["step_start"]) / max(
                1, last - phase["step_start"]
            )
        out.append(max(start, min(at, end)))
    return out
