"""The recipes a mixture search trains: its proxy (the base recipe with the ``proxy``
overrides) and each trial (the proxy on one mixture, named after the search)."""

from __future__ import annotations

from typing import Any

from ledgerlm.config import Recipe, RecipeError, apply_overrides, recipe_from_dict
from ledgerlm.errors import ArgumentError


def proxy_recipe(base: Recipe, proxy: list[str]) -> Recipe:
    """The base recipe with the ``proxy`` overrides; a proxy trains to its budget (no
    stop at the target) so the trials' final losses are comparable."""
    tree = apply_overrides(base.to_dict(), [*proxy, "eval.stop_at_target=false"])
    try:
        proxied = recipe_from_dict(tree, "proxy")
    except RecipeError as exc:  # "proxy: <key>: <why>", the argument named as such
        raise ArgumentError("{proxy}{rest}", rest=str(exc).removeprefix("proxy")) from None
    same_data = proxied.data.model_dump(exclude={"mixture"}) == base.data.model_dump(
        exclude={"mixture"}
    )
    if not same_data or proxied.tokenizer != base.tokenizer:
        raise ArgumentError(
            "{proxy} may not change [data] or [tokenizer]: the trials must share the data "
            "and token versions that the target run uses"
        )
    return proxied


def trial_recipe(proxied: Recipe, name: str, mix: Any) -> Recipe:
    """The proxy recipe named ``name`` on the mixture ``mix`` (weights or "natural")."""
    tree = proxied.to_dict()
    tree["name"] = name
    tree["data"]["mixture"] = {**tree["data"]["mixture"], "weights": mix, "stages": []}
    return recipe_from_dict(tree, name)
