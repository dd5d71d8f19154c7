"""The resources a run holds, and its device time: wall x devices held.

Every process start of a run (the fresh run, each resume) records a ``resources``
event: the device kind and name, devices per rank, ranks, hosts, threads per rank and
the host's cores, and the price per device-hour in force then (``price``), so a later
edit of a price table never rewrites an old bill. On a CPU a rank holds one device
("cpu"): two-rank DDP holds two devices, and its device-seconds are twice its wall.

The resources in force for a phase are those of the latest ``resources`` event
recorded at or before the phase started; a phase that started before the run's first
event (the ``startup`` of the command, a search charged to the run) counts the event
that follows it. A ``startup`` phase always counts the event that follows it (its
process's own). A phase whose detail holds ``device_seconds`` (a ``search`` phase: the
device time of the study's trials) counts that figure instead of wall x devices. A run
recorded before resources were (no event) counts one device per second, and its
``resources`` are ``None``.

Pure functions over the ledger's plain rows; no torch.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ledgerlm.ledger.events import RESOURCES

FIELDS = (
    "device_kind",
    "device_name",
    "devices_per_rank",
    "ranks",
    "hosts",
    "devices",
    "threads_per_rank",
    "host_cores",
)


def held(
    device_kind: str,
    device_name: str,
    ranks: int,
    *,
    hosts: int = 1,
    devices_per_rank: int = 1,
    threads_per_rank: int | None = None,
    host_cores: int | None = None,
    price: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``resources`` event's message: what one process start of a run holds."""
    if ranks < 1 or devices_per_rank < 1 or hosts < 1:
        raise ValueError(
            f"ranks, devices per rank and hosts must be >= 1, got {ranks}, "
            f"{devices_per_rank}, {hosts}"
        )
    return {
        "device_kind": str(device_kind),
        "device_name": str(device_name),
        "devices_per_rank": int(devices_per_rank),
        "ranks": int(ranks),
        "hosts": int(hosts),
        "devices": int(ranks) * int(devices_per_rank),
        "threads_per_rank": threads_per_rank,
        "host_cores": host_cores,
        "price": dict(price) if price is not None else None,
    }


def hosts_of(env: Mapping[str, str], ranks: int) -> int:
    """Hosts under torchrun: ``WORLD_SIZE`` ranks over ``LOCAL_WORLD_SIZE`` per host
    (rounded up); one host where torchrun did not say."""
    try:
        world, local = int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 1
    if world < 1 or local < 1:
        return 1
    return max(1, math.ceil(min(world, ranks) / local))


# -- prices ----------------------------------------------------------------------------


def check_prices(table: Any, where: str) -> dict[str, float]:
    """A ``per_device_hour`` table ({device kind or name: currency per device-hour}),
    each rate a finite number >= 0; errors are one line naming ``where``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: per_device_hour must be a table, e.g. {{cuda = 2.5}}")
    out: dict[str, float] = {}
    for key, rate in table.items():
        ok = isinstance(rate, int | float) and not isinstance(rate, bool)
        if not (ok and math.isfinite(rate) and rate >= 0):
            raise ValueError(
                f"{where}: per_device_hour.{key} must be a finite number >= 0, got {rate!r}"
            )
        out[str(key)] = float(rate)
    return out


def read_prices(path: Path) -> dict[str, float]:
    """The ``[cost] per_device_hour`` table of a workspace's ``cost.toml``; empty when
    the file does not exist."""
    if not path.is_file():
        return {}
    try:
        tree = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid TOML: {err}") from None
    cost = tree.get("cost", {})
    unknown = sorted(set(tree) - {"cost"}) + sorted(set(cost) - {"per_device_hour"})
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} (it holds [cost] per_device_hour)")
    return check_prices(cost.get("per_device_hour", {}), str(path))


def price(
    device_kind: str,
    device_name: str,
    recipe: Mapping[str, float] | None = None,
    workspace: Mapping[str, float] | None = None,
) -> dict[str, Any] | None:
    """The rate per device-hour for a device: the recipe's table over the workspace's
    (its entries win), and in the merged table the device's name over its kind.
    ``{"currency_per_device_hour", "key", "source"}``, or ``None`` when neither names it."""
    merged = {**(workspace or {}), **(recipe or {})}
    for key in (device_name, device_kind):
        if key in merged:
            source = "recipe" if key in (recipe or {}) else "workspace"
            return {"currency_per_device_hour": float(merged[key]), "key": key, "source": source}
    return None


# -- device time -----------------------------------------------------------------------


def recorded(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """The run's ``resources`` events as (when, resources), in order."""
    out = []
    for event in events:
        if event.get("kind") == RESOURCES:
            out.append((float(event["created_at"]), dict(json.loads(event["message"]))))
    return out


def in_force(
    phase: Mapping[str, Any], held_by: Sequence[tuple[float, dict[str, Any]]]
) -> dict[str, Any] | None:
    """The resources a phase was charged with (see the module's text); ``None`` when the
    run recorded none."""
    if not held_by:
        return None
    start = float(phase["started_at"])
    before = [r for at, r in held_by if at <= start]
    after = [r for at, r in held_by if at > start]
    if phase.get("kind") == "startup" and after:
        return after[0]
    return before[-1] if before else after[0]


def phase_device_seconds(phase: Mapping[str, Any], resources: Mapping[str, Any] | None) -> float:
    """A phase's device-seconds: its detail's ``device_seconds`` where it holds one,
    else its wall seconds x the devices held (one when no resources were recorded). An
    open phase counts 0, as its wall seconds do."""
    own = (phase.get("detail") or {}).get("device_seconds")
    if isinstance(own, int | float) and not isinstance(own, bool) and math.isfinite(own):
        return max(0.0, float(own))
    seconds = phase.get("seconds")
    if seconds is None or not math.isfinite(float(seconds)):
        return 0.0
    devices = int(resources["devices"]) if resources else 1
    return float(seconds) * devices


def charge(phases: Sequence[dict[str, Any]], events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Give every phase its ``device_seconds`` (in place) and return the run's device
    time: ``resources`` (those in force now: the latest event's, or ``None``),
    ``device_seconds`` (the total), ``phase_device_totals`` (by kind) and the
    resources each phase was charged with (``by_phase``, parallel to ``phases``)."""
    held_by = recorded(events)
    charged, totals = [], {}
    for phase in phases:
        resources = in_force(phase, held_by)
        phase["device_seconds"] = phase_device_seconds(phase, resources)
        totals[phase["kind"]] = totals.get(phase["kind"], 0.0) + phase["device_seconds"]
        charged.append(resources)
    latest = held_by[-1][1] if held_by else None
    return {
        "resources": None if latest is None else {k: latest.get(k) for k in (*FIELDS, "price")},
        "device_seconds": sum(totals.values()),
        "phase_device_totals": totals,
        "by_phase": charged,
    }


def cost(
    phases: Sequence[Mapping[str, Any]], charged_with: Sequence[Mapping[str, Any] | None]
) -> dict[str, Any] | None:
    """What ``phases`` cost at the price in force for each (``charged_with``: the
    resources each was charged with): ``{"currency_per_device_hour", "amount", "key"}``,
    or ``None`` when a phase has no price (no resources recorded, or no rate for its
    device). Phases charged at several rates give their mean rate per device-hour; the
    keys are joined by commas."""
    amount = hours = 0.0
    keys: list[str] = []
    rates: set[float] = set()
    for phase, resources in zip(phases, charged_with, strict=True):
        rate = (resources or {}).get("price")
        if not rate:
            return None
        phase_hours = float(phase["device_seconds"]) / 3600.0
        rates.add(float(rate["currency_per_device_hour"]))
        amount += phase_hours * float(rate["currency_per_device_hour"])
        hours += phase_hours
        if rate["key"] not in keys:
            keys.append(str(rate["key"]))
    if not keys:
        return None
    per_hour = rates.pop() if len(rates) == 1 else (amount / hours if hours else 0.0)
    return {"currency_per_device_hour": per_hour, "amount": amount, "key": ", ".join(keys)}
