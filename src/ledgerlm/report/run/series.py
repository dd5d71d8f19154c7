"""The series the run report draws, computed from the ledger: the ledger seconds at each
evaluation, the debiased moving average of per-update values, per-update throughput, and
the evenly spaced points a long series is drawn from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import finite
from ledgerlm.ledger.steps import throughput

SMOOTHING = 0.9  # weight of the past in the moving average of per-update series
MAX_POINTS = 2000  # per-update points drawn per series


def eval_seconds(summary: Mapping[str, Any]) -> list[float | None]:
    """Ledger seconds at each evaluation: every phase up to and including its phase."""
    phases = sorted(summary.get("phases", []), key=lambda p: p["id"])
    out: list[float | None] = []
    for ev in summary.get("evaluations", []):
        limit, created = ev.get("phase_id"), ev.get("created_at")
        if limit is not None:
            chosen = [p for p in phases if p["id"] <= limit]
        elif created is not None:  # not bound to a phase: the phases finished before it
            chosen = [p for p in phases if p.get("ended_at") and p["ended_at"] <= created]
        else:
            out.append(None)
            continue
        out.append(sum(finite(p.get("seconds")) or 0.0 for p in chosen))
    return out


def ema(values: Sequence[float | None], weight: float = SMOOTHING) -> list[float | None]:
    """The exponential moving average TensorBoard smooths scalars with, debiased.

    ``m_k = weight * m_(k-1) + (1 - weight) * v_k`` from ``m_0 = 0``, reported as
    ``m_k / (1 - weight**k)`` so early values are not pulled towards 0 (the first is
    ``v_1`` itself). Missing or non-finite values stay gaps and do not move the average.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"the smoothing weight must be in [0, 1), got {weight}")
    out: list[float | None] = []
    last, k = 0.0, 0
    for v in values:
        x = finite(v)
        if x is None:
            out.append(None)
            continue
        k += 1
        last = weight * last + (1.0 - weight) * x
        out.append(last / (1.0 - weight**k))
    return out


def tokens_per_second(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """(steps, tokens/s) of the per-update rows that know their wall seconds: each
    update's tokens over its own seconds."""
    steps, rates = [], []
    for r in rows:
        if (rate := throughput(r)) is not None:
            steps.append(int(r["step"]))
            rates.append(rate)
    return steps, rates


def thin(n: int, cap: int = MAX_POINTS) -> list[int]:
    """Indices of at most ``cap`` points evenly spread over ``n``, first and last kept."""
    if n <= cap:
        return list(range(n))
    return sorted({round(i * (n - 1) / (cap - 1)) for i in range(cap)})
