"""Time-to-target: what reaching the quality target actually cost.

A target is only *confirmed* at an evaluation: a loss that would have crossed the
threshold between two evaluations was not known to have crossed it, so the run kept
paying until the next evaluation said so. The bill therefore runs up to and including
the evaluation phase that confirmed the target, and covers every phase before it
(prep, tokenize, train, eval, checkpoint), not just the training steps.

The same bill in device time is ``device_seconds``: each phase's wall seconds x the
devices the run held then (``ledger.resources``), which two ranks double.

An evaluation written after the fact (``ledgerlm eval`` on a finished run's snapshot)
is bound to a phase of kind ``eval_after`` (``EVAL_AFTER``): it says how good a snapshot
was, not when the run knew it, so it never confirms a target nor breaks a streak, and
its phase is never on the bill. The seconds the downstream tasks took within the
charged evaluations are their own row of the bill (``task_seconds``), out of ``eval``.

These are pure functions over plain rows so that the rule can be tested and reused
without a database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TimeToTarget:
    """The verdict for one run; ``seconds`` is ``None`` unless the target was confirmed."""

    reached: bool
    step: int | None
    seconds: float | None
    by_phase: dict[str, float]
    evaluation: dict | None
    metric: str
    threshold: float
    targets: dict[str, float] = field(default_factory=dict)  # per-domain thresholds
    # wall x devices held of the charged phases (ledger.resources); None unless reached
    device_seconds: float | None = None
    cost: dict[str, Any] | None = None  # {currency_per_device_hour, amount, key} when priced
    # of the charged eval phases' seconds, those their tasks took; None without tasks
    task_seconds: float | None = None

    @property
    def device_hours(self) -> float | None:
        return None if self.device_seconds is None else self.device_seconds / 3600.0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimeToTarget:
        """The verdict back from ``to_dict`` (a run summary's ``time_to_target``)."""
        return cls(
            reached=d["reached"],
            step=d["step"],
            seconds=d["seconds"],
            by_phase=d["by_phase"],
            evaluation=d["evaluation"],
            metric=d["metric"],
            threshold=d["threshold"],
            targets=d.get("targets", {}),
            device_seconds=d.get("device_seconds"),  # absent from summaries before it
            cost=d.get("cost"),
            task_seconds=d.get("task_seconds"),  # absent from summaries before tasks
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form; an unreached run says so explicitly rather than omitting fields."""
        return {
            "reached": self.reached,
            "status": "reached" if self.reached else "not reached",
            "step": self.step,
            "seconds": self.seconds,
            "by_phase": dict(self.by_phase),
            "evaluation": dict(self.evaluation) if self.evaluation is not None else None,
            "metric": self.metric,
            "threshold": self.threshold,
            "targets": dict(self.targets),
            "device_seconds": self.device_seconds,
            "device_hours": self.device_hours,
            "cost": dict(self.cost) if self.cost is not None else None,
            "task_seconds": self.task_seconds,
        }

    def describe(self) -> str:
        """One line for humans; never claims success without a confirming evaluation."""
        if not self.reached or self.seconds is None:
            return "target NOT reached"
        return f"target reached at step {self.step} after {self.seconds:.1f} s"


# Metrics that are better higher (a task's accuracies); every other metric (losses,
# bits per byte) is better lower.
HIGHER_IS_BETTER = ("acc", "acc_norm", "exact_match")


def higher_is_better(metric: str) -> bool:
    """Whether ``metric`` improves upwards: ``task/<name>/acc``, ``acc_norm`` and
    ``exact_match`` do; losses and bits per byte (``task/<name>/bpb`` too) go down."""
    return metric.startswith("task/") and metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def target_key(key: str) -> str:
    """The metric a key of ``eval.targets`` stands for: a bare domain is its
    ``loss/<domain>``, anything with a ``/`` is a metric name itself."""
    return key if "/" in key else f"loss/{key}"


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else ``None``: how a
    ledger value that failed to compute (null, NaN, inf) reads. For a target that is a
    failed measurement, not a success: NaN compares False anyway, but -inf would
    otherwise "beat" any threshold."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def holds(
    metrics: Mapping[str, Any], name: str, threshold: float, confirm_by: str = "threshold"
) -> bool:
    """Whether one metric is on the right side of its threshold: at most it for losses
    and bits per byte, at least it for accuracies. With ``confirm_by="interval"`` a task
    metric is judged by the far end of its 95% interval (``<name>_low`` of an accuracy,
    ``<name>_high`` of bits per byte), so it holds only beyond the allowed error."""
    up = higher_is_better(name)
    if confirm_by == "interval" and name.startswith("task/"):
        name = f"{name}_low" if up else f"{name}_high"
    value = finite(metrics.get(name))
    if value is None:
        return False
    return value >= threshold if up else value <= threshold


def meets(
    metrics: Mapping[str, Any] | None,
    metric: str,
    threshold: float,
    targets: Mapping[str, float] | None = None,
    confirm_by: str = "threshold",
) -> bool:
    """Whether one evaluation meets the target: ``metric`` on the right side of
    ``threshold`` (``holds``) and every key of ``targets`` as well (a bare domain's
    ``loss/<domain>`` at or below its threshold, a task metric by its direction)."""
    if not metrics or not holds(metrics, metric, threshold, confirm_by):
        return False
    return all(holds(metrics, target_key(k), t, confirm_by) for k, t in (targets or {}).items())


def _phase_seconds(phase: Mapping[str, Any]) -> float:
    # A phase that never ended (crash, kill) counts 0 until Ledger.close_open_phases (run
    # by resume) ends it at its last heartbeat; its seconds are then a lower bound, since
    # the time between the last heartbeat and the kill is unknown and is not charged.
    seconds = phase.get("seconds")
    if seconds is None:
        return 0.0
    seconds = float(seconds)
    return seconds if math.isfinite(seconds) else 0.0


def _phase_device_seconds(phase: Mapping[str, Any]) -> float:
    # Ledger.run_summary gives each phase its device-seconds (ledger.resources); a phase
    # without them (plain rows) holds one device.
    if "device_seconds" not in phase:
        return _phase_seconds(phase)
    value = float(phase["device_seconds"])
    return value if math.isfinite(value) else 0.0


EVAL_AFTER = "eval_after"  # the phase of an evaluation written after the fact


def charged(
    phases: Sequence[Mapping[str, Any]], evaluation: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """The phases on the bill of a target confirmed at ``evaluation``: every phase up to
    and including the evaluation's (all of them when it is bound to none), except the
    after-the-fact evaluations' (``EVAL_AFTER``), which the run did not wait for."""
    limit = evaluation.get("phase_id")
    return [p for p in phases if (limit is None or p["id"] <= limit) and p["kind"] != EVAL_AFTER]


def in_the_run(
    phases: Sequence[Mapping[str, Any]], evaluations: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The evaluations the confirmation rule reads: all but those bound to an
    ``EVAL_AFTER`` phase (scored after the fact, they neither confirm nor break a streak)."""
    after = {p["id"] for p in phases if p["kind"] == EVAL_AFTER}
    return [ev for ev in evaluations if ev.get("phase_id") not in after]


def last_in_the_run(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The run's own last evaluation (the latest step; at one step the one written
    last), never one written after the fact, which may hold task metrics alone: where a
    run's final validation figures are read. None before its first evaluation."""
    own = in_the_run(summary.get("phases") or [], summary.get("evaluations") or [])
    # sorted() is stable: evaluations at the same step keep their given (id) order.
    ordered = sorted(own, key=lambda ev: ev["step"])
    return ordered[-1] if ordered else None


def task_seconds(bill: Sequence[Mapping[str, Any]]) -> float | None:
    """The seconds the downstream tasks took within the ``eval`` phases of ``bill`` (their
    detail's ``task_seconds``, per task); None when none of them scored a task.

    An evaluation scored in a background thread (its detail's ``eval_wall_seconds``)
    overlapped training: its phase holds only the time training waited for it, so its
    tasks are charged their share of that wait (phase seconds x task seconds / the
    evaluation's own wall seconds), never more than the phase itself."""
    spent = None
    for p in bill:
        detail = p.get("detail") or {}
        tasks = detail.get("task_seconds")
        if p["kind"] != "eval" or not tasks:
            continue
        own = sum(float(s) for s in tasks.values())
        wall = detail.get("eval_wall_seconds")
        if wall is not None:  # asynchronous: the tasks' share of the wait
            own = _phase_seconds(p) * min(1.0, own / float(wall)) if wall > 0 else 0.0
        spent = (spent or 0.0) + own
    return spent


def time_to_target(
    phases: Sequence[Mapping[str, Any]],
    evaluations: Sequence[Mapping[str, Any]],
    metric: str,
    threshold: float,
    confirm: int = 1,
    targets: Mapping[str, float] | None = None,
    confirm_by: str = "threshold",
) -> TimeToTarget:
    """Apply the confirmation rule: the target is confirmed at the first evaluation (by
    step) that completes ``confirm`` consecutive evaluations that ``meets`` it
    (``metric <= threshold`` and every per-domain threshold of ``targets``).

    Phase ids are insertion order, which is time order, so "everything spent until the
    confirming evaluation finished" is every phase whose id is at most that evaluation's
    phase id. An evaluation not bound to a phase cannot bound the bill, so all recorded
    phases are charged: overstating cost is safe, understating it is not. Evaluations
    made after the fact are skipped (``in_the_run``) and their phases never charged.
    """
    if confirm < 1:
        raise ValueError(f"confirm must be >= 1, got {confirm}")
    # sorted() is stable: evaluations at the same step keep their given (id) order.
    ordered = sorted(in_the_run(phases, evaluations), key=lambda ev: ev["step"])
    confirming, streak = None, 0
    for ev in ordered:
        ok = meets(ev.get("metrics"), metric, threshold, targets, confirm_by)
        streak = streak + 1 if ok else 0
        if streak == confirm:
            confirming = ev
            break
    if confirming is None:
        return TimeToTarget(
            reached=False,
            step=None,
            seconds=None,
            by_phase={},
            evaluation=None,
            metric=metric,
            threshold=threshold,
            targets=dict(targets or {}),
        )

    by_phase: dict[str, float] = {}
    bill = charged(phases, confirming)
    for phase in bill:
        kind = str(phase["kind"])
        by_phase[kind] = by_phase.get(kind, 0.0) + _phase_seconds(phase)
    return TimeToTarget(
        reached=True,
        step=int(confirming["step"]),
        seconds=sum(by_phase.values()),
        by_phase=by_phase,
        evaluation=dict(confirming),
        metric=metric,
        threshold=threshold,
        targets=dict(targets or {}),
        device_seconds=sum(_phase_device_seconds(p) for p in bill),
        task_seconds=task_seconds(bill),
    )
