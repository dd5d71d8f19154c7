"""A search's bill: its trial runs grouped by how they ended, with the wall and device
time each group cost (pure functions of ``Ledger.run_summary`` dicts).

A search (a tuning study, a mixture search, a scaling sweep) is charged to the run that
uses its result as a ``search`` phase (``lab.searches.charge_search``); its bill says
what the decision cost, the trials that missed the target, were pruned or failed
included. ``search_rows`` are the rows of its one table, which ``ledger show``, the
HTML report, ``mix search`` and ``scale run`` print alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# How a trial run ended, in the table's order (a run whose process died while it was
# still marked running, ``interrupted`` for ``lab.status``, is counted as running).
GROUPS = ("reached", "not reached", "pruned", "failed", "running")
OUTSIDE = "outside trials"  # the search's time around its trials (versions, the fit)


def trial_group(summary: Mapping[str, Any]) -> str:
    """The group of one trial run: its status, ``running`` for an unfinished one."""
    status = summary["run"]["status"]
    return status if status in GROUPS else "running"


def device_seconds(summary: Mapping[str, Any]) -> float:
    """A run's device time: every phase's wall x the devices held then
    (``summary["device_seconds"]``, ``ledger.resources``)."""
    return float(summary["device_seconds"])


def search_bill(
    summaries: Iterable[Mapping[str, Any]],
    *,
    seconds: float | None = None,
    device: float | None = None,
) -> dict[str, Any]:
    """The bill of a search from its trial runs' summaries: per group (``GROUPS``) the
    trials, their wall seconds and device seconds; ``trials``, their sum; ``outside``,
    the search's time around its trials when its own wall time (``seconds``) and device
    time (``device``) are given (the wall time around them counts one device when
    ``device`` is not given); ``total``, trials and outside together."""
    groups = {g: {"trials": 0, "seconds": 0.0, "device_seconds": 0.0} for g in GROUPS}
    for s in summaries:
        row = groups[trial_group(s)]
        row["trials"] += 1
        row["seconds"] += float(s["total_seconds"])
        row["device_seconds"] += device_seconds(s)
    trials = {
        k: sum(g[k] for g in groups.values()) for k in ("trials", "seconds", "device_seconds")
    }
    outside_wall = max(0.0, float(seconds) - trials["seconds"]) if seconds is not None else 0.0
    if device is None:
        outside_device = outside_wall
    else:
        outside_device = max(0.0, float(device) - trials["device_seconds"])
    outside = {"seconds": outside_wall, "device_seconds": outside_device}
    total = {
        "trials": trials["trials"],
        "seconds": trials["seconds"] + outside_wall,
        "device_seconds": trials["device_seconds"] + outside_device,
    }
    return {"groups": groups, "trials": trials, "outside": outside, "total": total}


def search_rows(bill: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a search's table: each group (``running`` only when a trial is), the
    time outside the trials when there is any, and ``all``; each with its trials (None
    outside them), wall seconds and device-hours."""

    def row(group: str, trials: int | None, part: Mapping[str, Any]) -> dict[str, Any]:
        hours = float(part["device_seconds"]) / 3600.0
        return {"group": group, "trials": trials, "seconds": float(part["seconds"]),
                "device_hours": hours}  # fmt: skip

    rows = [
        row(g, part["trials"], part)
        for g, part in bill["groups"].items()
        if g != "running" or part["trials"]
    ]
    if bill["outside"]["seconds"] > 0 or bill["outside"]["device_seconds"] > 0:
        rows.append(row(OUTSIDE, None, bill["outside"]))
    rows.append(row("all", bill["total"]["trials"], bill["total"]))
    return rows


def search_charges(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The searches charged to a run: the detail of each of its ``search`` phases that
    holds a bill (kind, search id, trials, device seconds, bill), with the phase's
    seconds; a phase recorded before searches had bills is left out."""
    return [
        {**p["detail"], "seconds": float(p["seconds"] or 0.0)}
        for p in summary["phases"]
        if p["kind"] == "search" and isinstance(p["detail"].get("bill"), Mapping)
    ]


def search_title(charge: Mapping[str, Any]) -> str:
    """``tune study S: 4 trials`` (plain text: callers escape it)."""
    what = {"tune": "tune study", "mix": "mixture search", "sweep": "scaling sweep"}
    n = int(charge["bill"]["total"]["trials"])
    kind = what.get(charge.get("kind", ""), "search")
    return f"{kind} {charge['search_id']}: {n} trial{'s' if n != 1 else ''}"
