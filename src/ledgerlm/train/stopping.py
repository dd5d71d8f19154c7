"""Rules that end a run early, as "not reached" (or "pruned"), at an evaluation.

The plan for a run that does not meet its target is fixed before it starts: the
recipe's rules (``eval.patience``, ``eval.project``) and, for a tuning trial, its
study's pruner. Each rule sees every evaluation in step order (the earlier ones of a
resumed run too) and may answer with a ``Stop``; the evaluator then stops the trainer
after that update, records an ``early_stop`` event with the rule's detail, and the run
ends with the stop's status. Rules are never asked once the target is confirmed.

A rule must decide from the evaluations alone, so that every rank of a ``torchrun``
run (which all see the same reduced metrics) stops after the same update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledgerlm.config import EvalConfig
from ledgerlm.ledger.target import higher_is_better

STOP_STATUSES = ("not reached", "pruned")


@dataclass(frozen=True)
class Stop:
    """A rule's verdict: the run's stop ``reason`` (one line), the ``status`` it ends
    with (one of ``STOP_STATUSES``) and a JSON-able ``detail`` kept in the event."""

    reason: str
    status: str = "not reached"
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STOP_STATUSES:
            raise ValueError(f"a stop's status is one of {STOP_STATUSES}, got {self.status!r}")


class StopRule(Protocol):
    """Asked after each evaluation (``record``: step, tokens, metrics, snapshot) with the
    run's evaluations so far (``history``, ``record`` last)."""

    name: str

    def __call__(
        self, record: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> Stop | None: ...


def _value(record: Mapping[str, Any], metric: str) -> float:
    value = (record.get("metrics") or {}).get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return math.nan  # a failed measurement improves nothing
    return float(value)


@dataclass(frozen=True)
class Patience:
    """``eval.patience``: stop when the last ``evaluations`` evaluations all failed to
    improve on the best before them. An evaluation improves when its ``metric`` is below
    the best so far by more than ``min_delta`` (strictly below it with 0); the best then
    becomes its value (so with a ``min_delta``, steps smaller than it add up until one
    counts). The first evaluation of the run sets the best."""

    metric: str
    evaluations: int
    min_delta: float = 0.0
    name: str = "patience"

    def __call__(
        self, record: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> Stop | None:
        best, best_step, since = math.nan, None, 0
        sign = -1.0 if higher_is_better(self.metric) else 1.0
        for h in history:
            value = _value(h, self.metric) * sign  # an accuracy is better higher
            if (best_step is None and not math.isnan(value)) or value < best - self.min_delta:
                best, best_step, since = value, h["step"], 0
            else:
                since += 1
        if since < self.evaluations:
            return None
        detail = {
            "metric": self.metric,
            "best": best * sign,
            "best_step": best_step,
            "evaluations": self.evaluations,
            "min_delta": self.min_delta,
        }
        return Stop(
            f"not reached (no improvement in {self.evaluations} evaluations)", detail=detail
        )


PROJECT_MIN_EVALUATIONS = 6  # points before a curve of 3 parameters is projected
PROJECT_MIN_SHARE = 0.1  # the curve's last point at this share of the budget or later


@dataclass(frozen=True)
class Projected:
    """``eval.project``: fit L(D) = E + A D^-alpha to the run's validation curve over
    tokens (``scaling.curve``) and stop when, at the ``budget_tokens``, both the fitted
    projection and the optimistic (low) end of its ``level`` interval lie above the
    ``threshold``. It projects only from ``PROJECT_MIN_EVALUATIONS`` evaluations on, the
    last of them at ``PROJECT_MIN_SHARE`` of the budget or later (no projection over
    more than 10x the tokens seen), and never on a fit that did not converge. The
    bootstrap is seeded, so every rank decides alike."""

    metric: str
    threshold: float
    budget_tokens: int
    level: float = 0.95
    seed: int = 0
    name: str = "project"

    def __call__(
        self, record: Mapping[str, Any], history: Sequence[Mapping[str, Any]]
    ) -> Stop | None:
        points = [
            (int(h["tokens"]), v)
            for h in history
            if (v := _value(h, self.metric)) > 0 and h.get("tokens", 0) > 0
        ]
        if len(points) < PROJECT_MIN_EVALUATIONS:
            return None
        last = points[-1][0]
        if not PROJECT_MIN_SHARE * self.budget_tokens <= last < self.budget_tokens:
            return None
        from ledgerlm.scaling.curve import fit_curve, project  # numpy and scipy, when used

        tokens, loss = zip(*points, strict=True)
        fit = fit_curve(tokens, loss)
        if not fit.converged or fit.predict([self.budget_tokens])[0] <= self.threshold:
            return None
        found = project(tokens, loss, self.budget_tokens, self.level, self.seed)
        if not found.converged or found.low <= self.threshold:
            return None
        detail = {
            "metric": self.metric,
            "threshold": self.threshold,
            "budget_tokens": self.budget_tokens,
            **found.to_dict(),
            "points": [list(p) for p in points],
        }
        return Stop("not reached (projected)", detail=detail)


def plan_rules(cfg: EvalConfig, budget_tokens: int) -> tuple[StopRule, ...]:
    """The recipe's stopping plan (``eval.patience``, ``eval.project``) on its target
    metric, for a run of at most ``budget_tokens`` training tokens."""
    metric, threshold, _ = cfg.target()
    rules: list[StopRule] = []
    if cfg.patience:
        rules.append(Patience(metric, cfg.patience, cfg.min_delta))
    if cfg.project:
        rules.append(Projected(metric, threshold, budget_tokens))
    return tuple(rules)
