"""How much of a run's wall time its phases account for.

A run's bill is the sum of its phases, so every second from the run's creation to the
end of its last phase should lie in one. What does not is reported, in two parts:

- ``uncovered_seconds``: gaps between phases of a live process (work nobody timed);
- ``interrupted_seconds``: the gaps that end at a phase marked ``resume`` (the time
  from a killed or failed process's last known moment to the restore of its resume,
  which is nobody's work and is not charged).

Cost: one pass over the run's phases, sorted by start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def phase_coverage(created_at: float, phases: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Wall time from ``created_at`` to the end of the last phase, what the phases hold,
    and the uncovered and interrupted gaps (seconds). An open phase counts up to its last
    heartbeat (or its start)."""
    cursor = float(created_at)
    uncovered = interrupted = held = 0.0
    for phase in sorted(phases, key=lambda p: float(p["started_at"])):
        start = float(phase["started_at"])
        if start > cursor:
            if (phase.get("detail") or {}).get("resume"):
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
    }
