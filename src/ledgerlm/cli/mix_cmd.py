"""``ledgerlm mix``: data mixtures: plan a mixture's exposure, search for one with proxy
runs, fit a mixture regression from a table of results, verify a mixture at scale."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ledgerlm.cli import mix_fit
from ledgerlm.cli.render import plan_stage_lines, plan_table
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    err_console,
    friendly_errors,
)
from ledgerlm.config import load_recipe

app = typer.Typer(
    help="Data mixtures: how much of each domain a run sees. Plan the tokens and epochs "
    "per domain, search mixtures with small proxy runs, fit a regression from mixture "
    "weights to loss, and verify the found mixture at the target scale.",
    no_args_is_help=True,
)
app.command("fit")(mix_fit.fit)


def _pairs(text: str, what: str) -> dict[str, float]:
    """``name=number,...`` (numbers may be written 1.5e9 or 1_500_000)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{what}: expected domain=number, got {item.strip()!r}")
        try:
            number = float(value.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"{what}: {name}: {value.strip()!r} is not a number") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{what}: {name}: {value.strip()!r} is not a number >= 0")
        out[name] = number
    return out


def print_plan(planned: dict, to_stderr: bool = False) -> None:
    """The plan table, its stages and its warnings (shared with `ledgerlm run`)."""
    out = err_console if to_stderr else console
    out.print(plan_table(planned))
    for line in plan_stage_lines(planned):
        out.print(escape(line), highlight=False)
    for line in planned["warnings"]:
        out.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)


@app.command("plan")
@friendly_errors
def plan(
    recipe: Annotated[
        Path | None,
        typer.Argument(help="Recipe TOML file; its data and token versions are built or reused."),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    ranks: Annotated[
        int,
        typer.Option("--ranks", min=1, help="Data-parallel ranks the run will use (torchrun)."),
    ] = 1,
    pools: Annotated[
        str | None,
        typer.Option(
            "--pools",
            help="Without a recipe: unique train tokens per domain, e.g. "
            "web=8e9,code=1.5e9,math=0.5e9.",
        ),
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(
            "--weights", help="With --pools: the mixture, e.g. web=0.5,code=0.3,math=0.2."
        ),
    ] = None,
    tokens: Annotated[
        float | None,
        typer.Option("--tokens", help="With --pools: the run's token budget D, e.g. 10e9."),
    ] = None,
    max_epochs: Annotated[
        float | None,
        typer.Option("--max-epochs", help="Warn above this exposure (default: the recipe's, 4)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan a mixture before training: per domain the unique pool S (train tokens), the
    weight p, the expected tokens E[D] = p D for the run's token budget D, and the
    exposure e = p D / S (epochs over the domain's unique tokens), with a warning for a
    domain repeated more than max_epochs times.

    D is max_steps x tokens per update (ranks x grad_accum x micro_batch_rows x
    seq_len), capped by eval.budget_tokens. `ledgerlm run` prints the same plan.
    """
    from ledgerlm.mixture.plan import plan_mixture

    if recipe is None:
        if pools is None or weights is None or tokens is None:
            raise ValueError("give a recipe, or --pools, --weights and --tokens")
        mix = _pairs(weights, "--weights")
        total = sum(mix.values())
        if abs(total - 1) > 1e-6:
            raise ValueError(f"--weights: the weights sum to {total:g}, not 1")
        unknown = sorted(set(mix) - set(_pairs(pools, "--pools")))
        if unknown:
            raise ValueError(f"--weights: no pool given for {', '.join(unknown)}")
        if not math.isfinite(tokens) or tokens <= 0:
            raise ValueError(f"--tokens: {tokens:g} is not a positive number")
        found = plan_mixture(
            {k: int(v) for k, v in _pairs(pools, "--pools").items()},
            mix,
            int(tokens),
            4.0 if max_epochs is None else max_epochs,
        )
    else:
        from ledgerlm.lab.mixture import plan_recipe
        from ledgerlm.workspace import Workspace

        extra = [f"data.mixture.max_epochs={max_epochs}"] if max_epochs is not None else []
        cfg = load_recipe(recipe, [*(set_ or []), *extra])
        with RichProgress() as progress:
            found = plan_recipe(cfg, Workspace(workspace), progress, ranks)
    planned = found.to_dict()
    if as_json:
        console.print_json(json.dumps(planned))
        return
    print_plan(planned)
