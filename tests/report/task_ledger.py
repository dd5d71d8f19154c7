"""Runs with downstream task metrics, written straight through the Ledger API (no
training): what the show, compare, report and sink tests read back.

Each evaluation's task metrics are the flat keys the loop writes (``task/<n>/<m>``,
``_stderr``, ``_low``, ``_high``, ``task/<n>/items``), computed here from a count of
correct items the way lm-evaluation-harness and the Wilson score interval do, so a
test states its figures as counts."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger import Ledger
from ledgerlm.ledger.events import TARGET_CONTRACT

EVERY = 100  # updates between evaluations
TOKENS_PER_STEP = 1000
TRAIN_SECONDS = 10.0
EVAL_SECONDS = 2.0
Z95 = 1.959963984540054


def accuracy(name: str, metric: str, correct: int, n: int) -> dict[str, float]:
    """The four keys of an accuracy of ``correct`` out of ``n`` items: the sample std
    (ddof=1) over sqrt(n) as its stderr, the Wilson score interval at 95%."""
    p = correct / n
    stderr = math.sqrt(p * (1 - p) * n / (n - 1) / n)
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    key = f"task/{name}/{metric}"
    return {
        key: p,
        f"{key}_stderr": stderr,
        f"{key}_low": centre - half,
        f"{key}_high": centre + half,
        f"task/{name}/items": float(n),
    }


def bits(name: str, value: float, stderr: float, n: int) -> dict[str, float]:
    """A bits-per-byte task's keys, its interval value +- 1.96 stderr."""
    key = f"task/{name}/bpb"
    return {
        key: value,
        f"{key}_stderr": stderr,
        f"{key}_low": value - Z95 * stderr,
        f"{key}_high": value + Z95 * stderr,
        f"task/{name}/items": float(n),
    }


def task_run(
    ledger: Ledger,
    name: str,
    recipe: Mapping[str, Any] | None = None,
    *,
    evals: Sequence[Mapping[str, float]],
    metric: str = "loss",
    threshold: float = 1.0,
    targets: Mapping[str, float] | None = None,
    confirm_by: str = "threshold",
    task_seconds: Sequence[Mapping[str, float]] | None = None,
    after: Sequence[tuple[int, Mapping[str, float], bool]] = (),
) -> str:
    """A run of one ``TRAIN_SECONDS`` train phase and one ``EVAL_SECONDS`` eval phase per
    entry of ``evals`` (that evaluation's metrics, at steps 100, 200, ...), the eval
    phase's detail holding ``task_seconds`` (its entry); its target contract; then per
    entry of ``after`` (step, metrics, harness) an evaluation written after the fact,
    bound to an ``eval_after`` phase."""
    contract = {
        "metric": metric,
        "unit": "accuracy" if metric.startswith("task/") else "nat/token",
        "threshold": threshold,
        "targets": dict(targets or {}),
        "confirm": 1,
        "confirm_by": confirm_by,
    }
    run = ledger.create_run(
        name,
        dict(recipe or {"name": name, "train": {"seed": 0}}),
        target_metric=metric,
        target_value=threshold,
        eval_every=EVERY,
        meta={"contract": contract},
    )
    measured = {"val_targets": 4096, "val_unigram_entropy": 5.5}  # as the run measures them
    ledger.add_event(run, TARGET_CONTRACT, json.dumps(contract | measured))
    for i, metrics in enumerate(evals):
        step = EVERY * (i + 1)
        ledger.record_phase(run, "train", TRAIN_SECONDS, step_start=step - EVERY, step_end=step)
        spent = dict(task_seconds[i]) if task_seconds else {}
        phase = ledger.record_phase(
            run, "eval", EVAL_SECONDS, step_start=step, step_end=step,
            detail={"task_seconds": spent} if spent else None,
        )  # fmt: skip
        _evaluation(ledger, run, step, metrics, phase)
    for step, metrics, harness in after:
        names = sorted({k.split("/")[1] for k in metrics if k.startswith("task/")})
        phase = ledger.record_phase(
            run, "eval_after", 1.5,
            detail={"snapshot_step": step, "harness": harness,
                    "task_seconds": dict.fromkeys(names, 1.0), "tasks": names},
        )  # fmt: skip
        _evaluation(ledger, run, step, metrics, phase)
    reached = ledger.run_summary(run)["time_to_target"]["reached"]
    ledger.finish_run(run, "reached" if reached else "not reached")
    return run


def _evaluation(
    ledger: Ledger, run: str, step: int, metrics: Mapping[str, float], phase: int
) -> None:
    ledger.add_evaluation(
        run,
        step=step,
        tokens=step * TOKENS_PER_STEP,
        targets=step * TOKENS_PER_STEP,
        updates=step,
        metrics=dict(metrics),
        snapshot=f"snap{step:06d}",
        phase_id=phase,
    )
