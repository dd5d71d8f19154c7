"""Continued pretraining: every domain before and after, gain and forgetting.

A run started from another run's weights (``train.init_from``) is scored before its
first update and after its last, on its own validation set (the new data) and on
the initial run's validation set (the data it was trained on). A domain of the new
set gains when its loss falls; a domain of the initial set is forgotten when its
loss rises. Both are in nat/token; positive means the named effect happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _domains(metrics: Mapping[str, float]) -> list[str]:
    return sorted(k.split("/", 1)[1] for k in metrics if k.startswith("loss/"))


def before_after(
    new_before: Mapping[str, float],
    new_after: Mapping[str, float],
    old_before: Mapping[str, float],
    old_after: Mapping[str, float],
) -> list[dict[str, Any]]:
    """One row per (set, domain): loss before and after, the change, and the gain (new
    set: before - after) or the forgetting (initial set: after - before).

    Metrics are evaluation dicts (``loss`` and ``loss/<domain>``); the overall loss of
    each set is the row with domain ``*``.
    """
    rows: list[dict[str, Any]] = []
    for which, before, after, sign in (
        ("new", new_before, new_after, 1.0),
        ("initial", old_before, old_after, -1.0),
    ):
        for domain in ["*", *_domains(before)]:
            key = "loss" if domain == "*" else f"loss/{domain}"
            if key not in after:
                continue
            b, a = float(before[key]), float(after[key])
            effect = "gain" if which == "new" else "forgetting"
            rows.append(
                {
                    "set": which,
                    "domain": domain,
                    "before": b,
                    "after": a,
                    "change": a - b,
                    "effect": effect,
                    "amount": sign * (b - a),
                }
            )
    return rows
