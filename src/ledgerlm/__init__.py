"""ledgerlm: a pretraining lab that keeps an honest ledger of what reaching quality costs.

The public API, re-exported lazily from the modules that own each concern, so
that data workers importing ``ledgerlm.data`` do not pay for importing PyTorch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Recipe": "ledgerlm.config",
    "RecipeError": "ledgerlm.config",
    "load_recipe": "ledgerlm.config",
    "BuiltVersion": "ledgerlm.workspace",
    "Workspace": "ledgerlm.workspace",
    "prepare_data": "ledgerlm.data.pipeline",
    "dedup_weights": "ledgerlm.data.budget",
    "weighted_mean": "ledgerlm.data.budget",
    "budget": "ledgerlm.data.budget",
    "TokenStore": "ledgerlm.tokens.shards",
    "build_tokens": "ledgerlm.tokens.shards",
    "GPT": "ledgerlm.model.gpt",
    "Ledger": "ledgerlm.ledger",
    "TimeToTarget": "ledgerlm.ledger",
    "time_to_target": "ledgerlm.ledger",
    "RunResult": "ledgerlm.lab.run",
    "run_recipe": "ledgerlm.lab.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerlm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
