"""The kinds of a run's events, which of them are warnings, and how to find one.

Warnings are events where something failed or wants a look, though the run went on (or,
for ``error``, ended). ``ledger show`` lists them in its events section; the other
events (the target contract, the mixture plan, timings) are data that other sections
render. A kind recorded more than once (a resumed run records some again) is read by
its latest event: the one in force.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Warnings.
ERROR = "error"  # the error that ended the run
INTERRUPTED = "interrupted"  # the signal that ended the run (Ctrl-C, SIGTERM, SIGHUP)
SINK_FAILED = "sink_failed"  # a sink dropped: the dashboard's copy stops there
NONFINITE = "nonfinite"  # a non-finite loss or gradient
LOSS_SPIKE = "loss_spike"  # an update's loss far above its running median
MIXTURE_WARNING = "mixture_warning"  # a domain repeated more than data.mixture.max_epochs
CONTAMINATION = "contamination"  # evaluation text found in the training data

# Data the run recorded (JSON messages unless said otherwise).
TARGET_CONTRACT = "target_contract"  # what "reached the target" means for this run
MIXTURE_PLAN = "mixture_plan"  # the per-domain plan, before training
VERSIONS_VERIFIED = "versions_verified"  # per version: reused, and what the checks found
TEST_EVALUATION = "test_evaluation"  # a snapshot (confirming, final) scored on the test split
CONTINUED_PRETRAINING = "continued_pretraining"  # before/after rows against the initial run
MIX_SEARCH = "mix_search"  # the mixture search a trial run belongs to
SWEEP = "sweep"  # the scaling sweep a run belongs to (its plan point)
SINKS = "sinks"  # the seconds each sink cost
EARLY_STOP = "early_stop"  # a stop rule ended the run (rule, reason, status, its detail)
TRAIN_END = "train_end"  # why training stopped (plain text)
RESUME = "resume"  # where a resumed run went on from (plain text)
CLOSED_OPEN_PHASES = "closed_open_phases"  # the phases a resume found open and closed
ENVIRONMENT = "environment"  # device, versions, TF32 and NCCL settings a (re)start trains with
RESOURCES = "resources"  # what a (re)start holds: devices, ranks, hosts, price (ledger.resources)
TASKS = "tasks"  # the downstream tasks a (re)start scores: name, kind, path, digest, items

WARNING_EVENTS = (
    ERROR,
    INTERRUPTED,
    SINK_FAILED,
    NONFINITE,
    LOSS_SPIKE,
    MIXTURE_WARNING,
    CONTAMINATION,
)


def warnings(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The warning events of a run's summary (``Ledger.run_summary``), in order."""
    return [e for e in summary["events"] if e["kind"] in WARNING_EVENTS]


def latest(summary: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The latest event of ``kind`` in a run's summary, or ``None`` when it has none."""
    for event in reversed(summary.get("events") or []):
        if event.get("kind") == kind:
            return event
    return None


def latest_json(summary: Mapping[str, Any], kind: str) -> Any:
    """The decoded JSON message of the latest event of ``kind``, or ``None``."""
    event = latest(summary, kind)
    return None if event is None else json.loads(event["message"])


def target_contract(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The target contract in force for the run (its latest ``target_contract`` event)."""
    found = latest_json(summary, TARGET_CONTRACT)
    return None if found is None else dict(found)
