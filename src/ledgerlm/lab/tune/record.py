"""A tuning study's record, ``tune/<study>/study.json``, beside its Optuna storage.

The record is written (atomically) before the first trial and again as each trial
ends, so a reader (``ledger show``, ``ledgerlm run --from-tune``) never needs Optuna:

    {"study", "plan", "plan_sha256", "complete", "objective",
     "seconds": the study's wall time, every command that worked on it summed,
     "device_seconds": its trial runs' device time summed,
     "trials": [{"number", "name": "<study>-tNN", "run", "status", "value", "params",
                 "overrides", "attempt", "seconds", "device_seconds", "metric",
                 "time_to_target"}],
     "best": {"number", "run", "value", "overrides", "status", "metric"} | None}

A trial's ``status`` is its run's (``reached``, ``not reached``, ``pruned``,
``failed``) or ``running`` while it trains; ``value`` is what the study was told
(``lab.tune.trial.objective_value``), None for a pruned, failed or running trial.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from ledgerlm.errors import ArgumentError
from ledgerlm.lab.searches import read_study
from ledgerlm.workspace import Workspace, atomic_write_json

TRIAL_STATUSES = ("reached", "not reached", "pruned", "failed", "running")
# Trials whose value ranks them: the others were stopped (pruned), broke or still train.
RANKED = ("reached", "not reached")


def plan_digest(plan: dict[str, Any]) -> str:
    """A hash of what determines a study (``lab.tune.study.study_plan``)."""
    blob = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def trial_name(study: str, number: int) -> str:
    """The ledger name of trial ``number`` (Optuna's, from 0): ``<study>-t00``."""
    return f"{study}-t{number:02d}"


def start_record(
    workspace: Workspace, study: str, plan: dict[str, Any], objective: str
) -> dict[str, Any]:
    """The study's record: read back (it must hold the same plan) when the study ran
    before, else written now, before its first trial, with no trial and ``complete``
    false."""
    path = workspace.study_file(study)
    digest = plan_digest(plan)
    if path.is_file():
        record = read_study(path)
        if record.get("plan_sha256") != digest:
            raise ArgumentError(
                "{path}: study {id} was planned from another recipe or settings; run it "
                "with the same recipe and flags, or give this one another --study NAME",
                path=path,
                id=study,
            )
        return record
    record = {
        "study": study,
        "plan": plan,
        "plan_sha256": digest,
        "complete": False,
        "objective": objective,
        "seconds": 0.0,
        "device_seconds": 0.0,
        "trials": [],
        "best": None,
    }
    write_record(workspace, record)
    return record


def write_record(workspace: Workspace, record: dict[str, Any]) -> None:
    """Write ``study.json`` atomically (its ``best`` and ``device_seconds`` brought up
    to date from its trials first)."""
    record["trials"].sort(key=lambda t: t["number"])
    record["device_seconds"] = sum(float(t.get("device_seconds") or 0.0) for t in record["trials"])
    record["best"] = best_trial(record["trials"])
    atomic_write_json(workspace.study_file(record["study"]), record)


def put_trial(record: dict[str, Any], row: dict[str, Any]) -> None:
    """Add trial ``row`` to the record, or replace the row of the same number."""
    if row["status"] not in TRIAL_STATUSES:
        raise ValueError(f"a trial's status is one of {TRIAL_STATUSES}, got {row['status']!r}")
    record["trials"] = [t for t in record["trials"] if t["number"] != row["number"]]
    record["trials"].append(row)
    record["trials"].sort(key=lambda t: t["number"])


def best_trial(trials: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ranked trial of least value (both objectives are minimised; the earlier of
    equal ones), or None when no trial is ranked yet."""
    ranked = [t for t in trials if t["status"] in RANKED and t.get("value") is not None]
    if not ranked:
        return None
    best = min(ranked, key=lambda t: (float(t["value"]), t["number"]))
    return {k: best.get(k) for k in ("number", "run", "value", "overrides", "status", "metric")}


def load_study(workspace: Workspace, ref: str) -> dict[str, Any]:
    """A study's record by name, unique prefix or ``latest`` (complete or not: see its
    ``complete``)."""
    return read_study(workspace.study_file(workspace.resolve_study(ref)))


class StudyClock:
    """The study's wall time over every command that worked on it: what the record held
    when this command began, plus this command's time as of each ``stamp``."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.started = time.perf_counter()
        self.before = float(record.get("seconds", 0.0))

    def stamp(self, record: dict[str, Any]) -> None:
        record["seconds"] = self.before + time.perf_counter() - self.started
