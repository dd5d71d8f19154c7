"""Legend labels for runs: the recipe keys whose values differ between them."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare import flatten

LABEL_KEYS = 4  # recipe differences named in a legend label (the rest are counted)
LABEL_VALUE_CHARS = 40
# Recipe sections that say where a run logs, not what it learned: never a difference.
IGNORED_SECTIONS = ("log",)
_UNSET = object()


def _value_text(value: Any) -> str:
    if value is _UNSET:
        text = "unset"
    elif value is None:
        text = "none"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= LABEL_VALUE_CHARS else text[: LABEL_VALUE_CHARS - 1] + "…"


def recipe_labels(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """A legend label per run: the recipe keys (dotted, from each summary's resolved
    ``run["recipe"]``) whose values differ between the runs, as ``key=value``.

    The ``log`` section (where a run logs) is not a difference; the recipe ``name`` is
    named only when nothing else differs. At most ``LABEL_KEYS`` keys are named, then
    ``+n more``. When nothing differs the label is the run's name, or its id when names
    repeat; runs whose labels would still coincide get that name or id appended."""
    flat = [
        {
            k: v
            for k, v in flatten(s["run"].get("recipe") or {}).items()
            if k.split(".")[0] not in IGNORED_SECTIONS
        }
        for s in summaries
    ]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    differ = [k for k in keys if len({_value_text(f.get(k, _UNSET)) for f in flat}) > 1]
    if differ != ["name"]:
        differ = [k for k in differ if k != "name"]
    names = [str(s["run"].get("name") or s["run"]["id"]) for s in summaries]
    fallback = names if len(set(names)) == len(names) else [str(s["run"]["id"]) for s in summaries]
    labels = []
    for f, own in zip(flat, fallback, strict=True):
        parts = [f"{k}={_value_text(f.get(k, _UNSET))}" for k in differ]
        if len(parts) > LABEL_KEYS:
            parts = [*parts[:LABEL_KEYS], f"+{len(parts) - LABEL_KEYS} more"]
        labels.append(", ".join(parts) or own)
    counts = Counter(labels)
    return [
        f"{label} ({own})" if counts[label] > 1 else label
        for label, own in zip(labels, fallback, strict=True)
    ]
