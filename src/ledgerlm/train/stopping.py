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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
