"""How busy the machine is while a benchmark runs (Linux /proc/stat), shared by the
benchmark scripts: a figure measured while other processes use the CPU is reported
with that share beside it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) CPU time of the whole machine from /proc/stat (Linux), else None."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def own_cpu() -> float:
    """CPU seconds of this process and of its finished (waited-for) child processes: a
    benchmark's own work, which may run as subprocesses."""
    return sum(os.times()[:4])


def foreign_load(start: tuple[int, int] | None, own_start: float) -> float | None:
    """Share of the machine's CPU time since ``start`` used by other processes than this
    one and its children (``own_start``: ``own_cpu()`` at ``start``): the numbers are
    only as good as this is small (a busy core stalls every parallel op)."""
    end = cpu_jiffies()
    if start is None or end is None or end[1] == start[1]:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = (own_cpu() - own_start) * hz
    return max(0.0, (end[0] - start[0] - own) / (end[1] - start[1]))


def load() -> str:
    """The load average and the cores, as one line to print beside a figure."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min), {os.cpu_count()} cores"


def measured(section: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """The figures ``section(*args)`` returns, with the share of the CPU other processes used
    while it ran (``other_load``) and the load after it (``load_after``), both printed."""
    start, own = cpu_jiffies(), own_cpu()
    out = section(*args)
    out["other_load"] = foreign_load(start, own)
    out["load_after"] = load()
    share = "-" if out["other_load"] is None else f"{out['other_load']:.1%}"
    print(f"  other processes' CPU share {share}; {out['load_after']}")
    return out
