"""Comparing runs on their downstream tasks: what ``ledger.compare`` reads of each run's
task metrics, kept apart from its time-to-target rule.

* **final metrics**: each run's validation measure and every task metric at the last
  evaluation that measured each (one written after the fact counts: it scored the
  run's weights), with its standard error, so runs are set side by side on what they
  last measured rather than on an evaluation one of them skipped.
* **the task check**: a run whose validation loss improved on the baseline's while a
  task metric did not (by its direction: accuracies up, bits per byte down) is named in
  one line with both figures and their standard errors, since a lower loss is not yet
  a better model on the tasks.
* **seed groups**: the values of each final metric over a group's runs, which
  ``ledger.compare`` spreads (mean, sample std, min-max, n) beside the time to target.

Evaluations written after the fact (``ledgerlm eval``) are found by their phase
(``ledger.target.EVAL_AFTER``), and the seconds tasks took by the phases' detail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.target import EVAL_AFTER, finite, higher_is_better


def is_task_metric(key: str) -> bool:
    """Whether ``key`` is a task metric's value, ``task/<name>/<metric>``: not its
    ``_stderr``, ``_low``, ``_high`` nor the task's ``items``."""
    from ledgerlm.config import TASK_METRICS  # pydantic: not at the command line's start

    parts = key.split("/")
    return (
        len(parts) == 3
        and parts[0] == "task"
        and any(parts[2] in metrics for metrics in TASK_METRICS.values())
    )


def task_metric_names(evaluations: Sequence[Mapping[str, Any]]) -> list[str]:
    """The task metrics the evaluations hold, in the order first seen (the recipe's)."""
    found = {k: None for ev in evaluations for k in ev.get("metrics") or {} if is_task_metric(k)}
    return list(found)


def after_the_fact(summary: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The evaluations written after the fact (bound to an ``eval_after`` phase): each
    one's id with its phase's detail (``snapshot_step``, ``harness``, ``task_seconds``)."""
    later = {p["id"]: p for p in summary.get("phases", []) if p.get("kind") == EVAL_AFTER}
    return {
        ev["id"]: dict(later[ev["phase_id"]].get("detail") or {})
        for ev in summary.get("evaluations", [])
        if ev.get("phase_id") in later
    }


def task_seconds(summary: Mapping[str, Any], kind: str = "eval") -> dict[str, float]:
    """Seconds spent scoring each task over the run's phases of ``kind`` (the detail's
    ``task_seconds`` of each evaluation phase), by task name. An evaluation scored in a
    background thread overlapped training: its phase holds only the wait, and its tasks
    count their share of it (as on the bill, ``ledger.target.task_seconds``), so the
    tasks never hold more than the phases they are part of."""
    out: dict[str, float] = {}
    for phase in summary.get("phases", []):
        if phase.get("kind") != kind:
            continue
        detail = phase.get("detail") or {}
        share = 1.0
        wall = finite(detail.get("eval_wall_seconds"))
        if wall is not None:
            held = finite(phase.get("seconds")) or 0.0
            share = min(1.0, held / wall) if wall > 0 else 0.0
        for name, seconds in (detail.get("task_seconds") or {}).items():
            if (value := finite(seconds)) is not None:
                out[name] = out.get(name, 0.0) + value * share
    return out


def val_metric(summary: Mapping[str, Any]) -> str:
    """The run's validation measure: its target metric, or the loss when the target is a
    task metric."""
    metric = str(summary["run"].get("target_metric") or "loss")
    return "loss" if metric.startswith("task/") else metric


def final_metrics(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The validation measure and every task metric at the run's last evaluation that
    measured each: ``{metric: {"value", "stderr", "step"}}``, the validation measure
    first. An evaluation written after the fact counts (it scored the run's weights),
    but at the step of one of the run's own the run's own wins (``ledgerlm eval
    --limit`` may have scored fewer items under the same name)."""
    later = after_the_fact(summary)
    evaluations = sorted(
        summary.get("evaluations") or [],
        key=lambda ev: (ev["step"], ev["id"] not in later, ev["id"]),
    )
    out: dict[str, dict[str, Any]] = {}
    for key in [val_metric(summary), *task_metric_names(evaluations)]:
        for ev in reversed(evaluations):
            metrics = ev.get("metrics") or {}
            if (value := finite(metrics.get(key))) is not None:
                stderr = finite(metrics.get(f"{key}_stderr"))
                out[key] = {"value": value, "stderr": stderr, "step": ev["step"]}
                break
    return out


def pm(value: float | None, stderr: float | None) -> str:
    """``0.62±0.07``: a value to the decimal of its standard error's first digit (two
    decimals at least, five at most), ``-`` when unknown."""
    if value is None:
        return "-"
    if stderr is None:
        return f"{value:.4f}"
    digits = 2 if stderr <= 0 else min(5, max(2, -math.floor(math.log10(stderr))))
    return f"{value:.{digits}f}±{stderr:.{digits}f}"


def _better(metric: str, new: float, old: float) -> bool:
    return new > old if higher_is_better(metric) else new < old


def task_check(base: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Whether ``other``'s validation measure improved on the baseline's (lower) while a
    task metric did not (by its direction), from each run's ``final_metrics``.

    ``line`` says so in one line with both figures and their standard errors; ``None``
    when the validation measure did not improve or every task metric did too."""
    metric = base["val_metric"]
    a, b = (f["final_metrics"].get(metric) for f in (base, other))
    out: dict[str, Any] = {"metric": metric, "improved": None, "tasks": [], "line": None}
    if a is None or b is None:
        return out
    out["improved"] = b["value"] < a["value"]
    for key in base["final_metrics"]:
        x, y = base["final_metrics"][key], other["final_metrics"].get(key)
        if key == metric or y is None:
            continue
        out["tasks"].append(
            {
                "metric": key,
                "baseline": x["value"],
                "baseline_stderr": x["stderr"],
                "run": y["value"],
                "run_stderr": y["stderr"],
                "improved": _better(key, y["value"], x["value"]),
            }
        )
    worse = [t for t in out["tasks"] if not t["improved"]]
    if out["improved"] and worse:
        cells = "; ".join(
            f"{t['metric']} {pm(t['run'], t['run_stderr'])} vs "
            f"{pm(t['baseline'], t['baseline_stderr'])}"
            for t in worse
        )
        out["line"] = (
            f"{other['id']}: val {metric} improved ({b['value']:.4f} vs {a['value']:.4f}, "
            f"baseline) but not {cells} (run vs baseline, ±stderr)"
        )
    return out


def final_metric_values(figures: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Each final metric any of ``figures`` (``run_figures``) holds, in the order first
    seen, with its value in every run that measured it: what a seed group spreads."""
    keys = dict.fromkeys(k for f in figures for k in f["final_metrics"])
    return {
        key: [f["final_metrics"][key]["value"] for f in figures if key in f["final_metrics"]]
        for key in keys
    }
