"""ledgerlm: a pretraining lab that keeps an honest ledger of what reaching quality costs.

The public API, re-exported from the modules that own each concern.
"""

from ledgerlm.config import Recipe, RecipeError, load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.ledger import Ledger, TimeToTarget, time_to_target
from ledgerlm.model.gpt import GPT
from ledgerlm.runner import RunResult, run_recipe
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.workspace import BuiltVersion, Workspace

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "BuiltVersion",
    "Ledger",
    "Recipe",
    "RecipeError",
    "RunResult",
    "TimeToTarget",
    "TokenStore",
    "Workspace",
    "build_tokens",
    "load_recipe",
    "prepare_data",
    "run_recipe",
    "time_to_target",
]
