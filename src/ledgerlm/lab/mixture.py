"""A recipe's mixture against a token version: the run's token budget, the resolved
segments the sampler follows, and the plan (tokens and epochs per domain) shown before
training and kept in the ledger (``ledger.mixture`` reads it back beside what the run
really consumed).
"""

from __future__ import annotations

from typing import Any

from ledgerlm.config import Recipe, recipe_from_dict
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.mixture.plan import MixturePlan, plan_segments
from ledgerlm.mixture.schedule import Segment, resolve
from ledgerlm.progress import Progress
from ledgerlm.shape import tokens_per_update
from ledgerlm.tokens.loader import natural_shares, train_pools
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.workspace import Workspace, read_json


def token_budget(recipe: Recipe, ranks: int = 1) -> int:
    """D: the most training tokens the run can consume (``max_steps`` updates, capped by
    ``eval.budget_tokens`` when set). Stopping at the target may end it sooner."""
    most = recipe.train.max_steps * tokens_per_update(recipe, ranks)
    cap = recipe.eval.budget_tokens
    return min(most, cap) if cap else most


def segments(recipe: Recipe, store: TokenStore, ranks: int = 1) -> list[Segment]:
    """The mixture's segments for this store and rank count (stage ends in tokens)."""
    return resolve(recipe.data.mixture, token_budget(recipe, ranks), natural_shares(store))


def plan(recipe: Recipe, store: TokenStore, ranks: int = 1) -> MixturePlan:
    """The plan of the recipe's mixture on this store: S_i, p_i, E[D_i], e_i per domain."""
    return plan_segments(
        train_pools(store),
        segments(recipe, store, ranks),
        token_budget(recipe, ranks),
        recipe.data.mixture.max_epochs,
    )


def plan_recipe(
    recipe: Recipe, workspace: Workspace, progress: Progress | None = None, ranks: int = 1
) -> MixturePlan:
    """The plan of a recipe's mixture: its data and token versions are built (or reused)
    first, since the pools S_i are the train split's tokens per domain. A mixture
    taken from a search (``from_search``) is planned with the search's weights."""
    recipe, _ = use_search(recipe, workspace)
    data = prepare_data(recipe.data_stage(), workspace, progress)
    tokens = build_tokens(data, recipe.tokenizer, workspace, progress)
    return plan(recipe, TokenStore(tokens.path), ranks)


def load_search(workspace: Workspace, ref: str) -> dict[str, Any]:
    """A finished search's record by id, unique prefix or ``latest``; a search still
    under way (or killed) has no result yet, and is refused in one line."""
    path = workspace.search_file(workspace.resolve_search(ref))
    record = read_json(path)
    if not record.get("complete", True):  # records of older code were written complete
        plan = record.get("plan", {})
        done = f"{len(record.get('trials', []))} of {plan.get('trials', 2)} trials"
        raise ValueError(
            f"{path}: mixture search {record.get('search_id')} has no result yet ({done} "
            "done): run the same `ledgerlm mix search` again to finish it"
        )
    return record


def use_search(recipe: Recipe, workspace: Workspace) -> tuple[Recipe, dict[str, Any] | None]:
    """The recipe with ``data.mixture.from_search`` resolved: the search's full id and
    its recommended weights (the stored recipe names exactly what was trained on), and
    the search record (None when the recipe names no search)."""
    mixture = recipe.data.mixture
    if mixture.from_search is None:
        return recipe, None
    record = load_search(workspace, mixture.from_search)
    weights = {d: float(w) for d, w in record["recommended"].items()}
    # the weights a search recommends sum to 1 up to rounding: make it exact
    total = sum(weights.values())
    weights = {d: w / total for d, w in weights.items()}
    if mixture.weights != "natural" and mixture.weights != weights:
        raise ValueError(
            f"data.mixture: set weights or from_search = {mixture.from_search!r}, not both"
        )
    tree = recipe.to_dict()
    tree["data"]["mixture"].update(weights=weights, from_search=record["search_id"])
    return recipe_from_dict(tree, "data.mixture.from_search"), record
