"""``ledgerlm config``: inspect recipes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ledgerlm.cli.ui import JsonOpt, SetOpt, console, friendly_errors, load_recipe

app = typer.Typer(help="Inspect recipes.", no_args_is_help=True)


@app.command("show")
@friendly_errors
def show(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file.")],
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the fully resolved recipe: every default filled in, overrides applied, and
    each setting nothing reads marked with the reason (# unused: target_bpb is set); with
    --json the recipe's sections and an "unused" table of dotted key -> reason."""
    resolved = load_recipe(recipe, set_)
    if as_json:
        console.print_json(json.dumps({**resolved.to_dict(), "unused": resolved.unused_settings()}))
    else:
        from ledgerlm.config import recipe_to_toml

        console.print(recipe_to_toml(resolved), highlight=False, markup=False, soft_wrap=True)
