"""Replacing a damaged data or tokens version: its folder is removed, then the recipe
that names it builds it again. A version id hashes the inputs and the settings, so the
version rebuilt from the same inputs is the same version (and a recipe whose inputs
changed does not name it: it is refused)."""

from __future__ import annotations

from pathlib import Path

from ledgerlm.config import Recipe
from ledgerlm.data.pipeline import data_version, prepare_data
from ledgerlm.progress import Progress
from ledgerlm.tokens.shards import build_tokens, tokens_version
from ledgerlm.workspace import BuiltVersion, Workspace


def repair_version(
    recipe: Recipe,
    workspace: Workspace,
    ref: str,
    progress: Progress | None = None,
    base: Path | None = None,
) -> list[BuiltVersion]:
    """Rebuild ``ref`` (an id, or a unique prefix, of the recipe's data or tokens
    version) whatever state it is in; the data version, then the tokens version when
    that was the one repaired (the data version is reused if intact)."""
    cfg = recipe.data_stage()
    data_id = data_version(cfg, base)[0]
    tokens_id = tokens_version(data_id, recipe.tokenizer)
    named = [(k, v) for k, v in (("data", data_id), ("tokens", tokens_id)) if v.startswith(ref)]
    if not ref or len(named) != 1:
        raise ValueError(
            f"repair {ref!r}: recipe {recipe.name} names data version {data_id} and tokens "
            f"version {tokens_id}; give one of them"
        )
    kind, version = named[0]
    workspace.discard(kind, version)
    data = prepare_data(cfg, workspace, progress, base)
    if kind == "data":
        return [data]
    return [data, build_tokens(data, recipe.tokenizer, workspace, progress)]
