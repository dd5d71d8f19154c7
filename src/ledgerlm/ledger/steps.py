"""What a run's per-update rows (``Ledger.steps``) say beyond their columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledgerlm.ledger.compare import finite


def throughput(row: Mapping[str, Any]) -> float | None:
    """One update's tokens per second: its tokens over its own wall seconds; ``None``
    for a row that does not know its (positive) seconds."""
    seconds, tokens = finite(row.get("seconds")), finite(row.get("tokens"))
    if seconds is None or seconds <= 0 or tokens is None:
        return None
    return tokens / seconds
