"""A mixture search's plan, its id and its record in ``mixtures/<search id>.json``: the
record is written before the first trial and as each finishes, with the search's wall
time (``SearchClock``), its device time and its bill (``ledger.search``); each of its
runs carries a ``mix_search`` event."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from ledgerlm.config import NAME_MAX, NAME_RULE, Recipe, is_name, shown
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.searches import trial_summaries
from ledgerlm.ledger.events import MIX_SEARCH
from ledgerlm.ledger.search import search_bill
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace, atomic_write_json, read_json


def write_event(workspace: Workspace, run_id: str, message: dict[str, Any]) -> None:
    """The ``mix_search`` event of one of the search's runs."""
    with Ledger(workspace.ledger_path) as ledger:
        ledger.add_event(run_id, MIX_SEARCH, json.dumps(message))


def search_id_of(base: Recipe, plan: dict[str, Any], name: str | None = None) -> str:
    """The search's id: ``name`` when given, else ``<recipe>-mix-<6 hex>`` of the plan's
    hash (``plan_digest``): the same command gets the same id, so it continues."""
    found = name or f"{base.name}-mix-{plan_digest(plan)[:6]}"
    if not is_name(found) or len(f"{found}-proxy") > NAME_MAX:
        raise ValueError(
            f"search id {shown(found)}: expected a name of {NAME_RULE} (its trials add "
            "up to 6 characters)"
        )
    return found


def plan_digest(plan: dict[str, Any]) -> str:
    """A hash of what determines a search: the base recipe's digest (its seed included)
    and the search's settings (method, proxy overrides, trials, draws, fit)."""
    blob = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def search_plan(base: Recipe, method: str, proxy: list[str], **settings: Any) -> dict[str, Any]:
    """What determines a search: its method, the base recipe's digest, the proxy
    overrides and the method's settings."""
    return {"method": method, "base_recipe_sha256": base.digest(), "proxy": proxy, **settings}


def start_record(workspace: Workspace, search_id: str, plan: dict[str, Any]) -> dict[str, Any]:
    """The search's record in ``mixtures/<search id>.json``: read back (it must hold the
    same plan) when the search ran before, else written now, before its first trial, with
    no trial yet and ``complete`` false."""
    path = workspace.search_file(search_id)
    digest = plan_digest(plan)
    if path.is_file():
        try:
            record = read_json(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a search record ({exc})") from None
        if not isinstance(record, dict) or record.get("plan_sha256") != digest:
            raise ArgumentError(
                "{path}: search {id} was planned from another recipe or settings; run it "
                "with the same recipe and flags, or give this one another {search_id}",
                path=path,
                id=search_id,
            )
        return record
    record = {
        "search_id": search_id,
        "plan": plan,
        "plan_sha256": digest,
        "complete": False,
        "trials": [],
        "trial_seconds": 0.0,
        "other_seconds": 0.0,
        "seconds": 0.0,
    }
    atomic_write_json(path, record)
    return record


class SearchClock:
    """The search's wall time over every command that worked on it: its trials' time as
    the ledger charges each run (a killed run's time up to its last heartbeat included,
    the time between the kill and the resume not), plus the time around them (versions,
    the fit) that each command spent, as of its last write. With the workspace, each
    stamp also brings the search's device time and bill up to date (``stamp_bill``)."""

    def __init__(self, record: dict[str, Any], workspace: Workspace | None = None) -> None:
        self.workspace = workspace
        self.started = time.perf_counter()
        self.before = float(record.get("other_seconds", 0.0))
        self.work = 0.0  # this command's seconds inside the trials it trained

    def trained(self, run: Any) -> None:
        self.work += float(run.summary["total_seconds"]) - run.seconds_before

    def stamp(self, record: dict[str, Any], trial_seconds: float) -> None:
        other = self.before + time.perf_counter() - self.started - self.work
        record.update(
            trial_seconds=trial_seconds, other_seconds=other, seconds=trial_seconds + other
        )
        if self.workspace is not None:
            stamp_bill(self.workspace, record)


def stamp_bill(workspace: Workspace, record: dict[str, Any]) -> None:
    """The search's bill (``ledger.search.search_bill``) from its trial runs in the ledger
    and its wall time, and its device time (the bill's total: the trials' device time,
    and the time around them on one device), kept in the record beside its seconds."""
    with Ledger(workspace.ledger_path, read_only=True) as ledger:
        summaries = trial_summaries(ledger, [t["run"] for t in record["trials"]])
    bill = search_bill(summaries, seconds=float(record["seconds"]))
    record.update(device_seconds=bill["total"]["device_seconds"], bill=bill)
