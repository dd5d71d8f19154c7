"""``ledgerlm scale``: plan and run sweeps of model size x tokens, fit L(N, D), and
recommend a compute-optimal (and lifecycle-optimal) model for a budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ledgerlm.cli import scale_fit, scale_serving
from ledgerlm.cli.render import print_search_bill
from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    friendly_errors,
    load_recipe,
)
from ledgerlm.cli.ui import fmt_g as _g

app = typer.Typer(
    help="Scaling sweeps: plan and run a grid of model sizes N x token budgets D on one "
    "data version, fit L(N, D) = E + A N^-alpha + B D^-beta, and recommend N and D for a "
    "compute budget (C = 6 N D), with bootstrap intervals.",
    no_args_is_help=True,
)

RecipeArg = Annotated[Path, typer.Argument(help="Base recipe TOML file.")]
SizesOpt = Annotated[
    str,
    typer.Option(
        "--sizes",
        help="Target parameter counts N, comma-separated (e.g. 2e5,5e5). N counts the blocks, "
        "final norm and output head, not the token embedding; each becomes the closest shape.",
    ),
]
TokensOpt = Annotated[
    str | None,
    typer.Option(
        "--tokens",
        help="Token budgets D, comma-separated (e.g. 1e5,2e5): every size trains on every "
        "budget. Rounded up to whole optimizer steps.",
    ),
]
FlopsOpt = Annotated[
    str | None,
    typer.Option(
        "--flops",
        help="isoFLOP budgets C, comma-separated (e.g. 1e11,3e11): every size trains on "
        "D = C / (6 N) tokens. Instead of --tokens.",
    ),
]
LrRuleOpt = Annotated[
    str,
    typer.Option(
        "--lr-rule",
        help="Tuning rule: fixed (the base recipe's train.lr for every size) or sqrt "
        "(lr x sqrt(base d_model / d_model)). Recorded in every run.",
    ),
]


def _plan(recipe_path: Path, set_: list[str] | None, sizes, tokens, flops, lr_rule):
    from ledgerlm.scaling.sweep import plan

    base = load_recipe(recipe_path, set_)
    points = plan(
        base,
        scale_fit.numbers(sizes, "--sizes") or [],
        scale_fit.numbers(tokens, "--tokens"),
        scale_fit.numbers(flops, "--flops"),
        lr_rule=lr_rule,
    )
    return base, points


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _plan_table(points, title: str) -> FitTable:
    t = FitTable(title=title, show_edge=False)
    for col in ("point", "N", "shape", "steps", "D", "C=6ND", "lr"):
        t.add_column(col, justify="left" if col in ("point", "shape") else "right")
    for p in points:
        t.add_row(
            escape(p.name),
            f"{p.N:,}",
            f"d{p.d_model} L{p.n_layers} h{p.n_heads}",
            f"{p.max_steps:,}",
            f"{p.D:,}",
            _g(p.C),
            f"{p.lr:.4g}",
        )
    return t


def _targets_line(points) -> str:
    sizes = ", ".join(dict.fromkeys(_g(p.target_N) for p in points))
    if points[0].target_C is not None:
        budgets = "C " + ", ".join(dict.fromkeys(_g(p.target_C) for p in points))
    else:
        budgets = "D " + ", ".join(dict.fromkeys(_g(p.target_D) for p in points))
    return f"targets: N {sizes}; {budgets} (shape dN LN hN: d_model, n_layers, n_heads)"


def _rule_lines(base, points) -> list[str]:
    rule = points[0].rule
    t = base.train
    return [
        f"tokens per step: {rule['tokens_per_step']:,} (micro_batch_rows {t.micro_batch_rows} x "
        f"grad_accum {t.grad_accum} x seq_len {base.pack.seq_len}); vocab "
        f"{base.tokenizer.vocab_size:,} (tokenizer.vocab_size)",
        f"N: {rule['N']}",
        f"shape rule: {rule['shape']}",
        f"lr rule {rule['lr_rule']}: {rule['lr']} (base lr {rule['base_lr']:g}, base d_model "
        f"{rule['base_d_model']})",
        f"warmup: {rule['warmup']}; eval: {rule['eval']}",
    ]


@app.command("plan")
@friendly_errors
def plan_cmd(
    recipe: RecipeArg,
    sizes: SizesOpt,
    tokens: TokensOpt = None,
    flops: FlopsOpt = None,
    lr_rule: LrRuleOpt = "fixed",
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the runs a sweep would make, without running anything.

    For each size: the shape chosen and its realized N; for each token budget: the
    optimizer steps, the realized D and C = 6 N D; the tuning rule and learning rate.

    Shape rule: d_model a multiple of 16 with d_model / n_layers between 16 and 256
    (d_model = 64 x n_layers within a factor 4), 32-wide heads (16 when 32 does not divide
    d_model); the shape whose N is closest to the target, ties within one point going to
    the one nearest d_model = 64 x n_layers.
    """
    base, points = _plan(recipe, set_, sizes, tokens, flops, lr_rule)
    if as_json:
        out = {
            "recipe": base.name,
            "rule": points[0].rule,
            "points": [{k: v for k, v in p.to_dict().items() if k != "rule"} for p in points],
        }
        console.print_json(json.dumps(out))
        return
    console.print(_plan_table(points, f"sweep plan: {_runs(len(points))} of {escape(base.name)}"))
    for line in [_targets_line(points), *_rule_lines(base, points)]:
        console.print(escape(line), highlight=False, soft_wrap=True)


@app.command("run")
@friendly_errors
def run_cmd(
    recipe: RecipeArg,
    sizes: SizesOpt,
    tokens: TokensOpt = None,
    flops: FlopsOpt = None,
    lr_rule: LrRuleOpt = "fixed",
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going",
            help="When a run fails (e.g. a diverged loss), keep it in the sweep as failed and "
            "run the next point instead of stopping.",
        ),
    ] = False,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="The sweep id (its runs are named <name>-<point>). Default: "
            "<recipe>-sweep-<6 hex of the plan's hash>, so the same command continues it.",
        ),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a sweep: every point of `scale plan`, one after another, on one data version.

    The first run prepares (or reuses) the data and tokens versions; every other run must
    reuse them. Each run trains its full budget (no early stop at the target), keeps its
    whole curve in the ledger, is named <sweep id>-<point> and carries a `sweep` event with
    the point, its overrides and the tuning rule. Prints the sweep id for `scale fit` and
    the sweep's table (its runs by how they ended, the wall time and device-hours of each).

    The sweep id comes from the plan (recipe, grid, rule) or --name, and the plan is kept
    in sweeps/<sweep id>.json before the first run: the same command run again continues
    the sweep, reusing the points that finished and resuming the one that was interrupted
    from its checkpoint.
    """
    from ledgerlm.lab.sweep import run_sweep_points, sweep_id_of
    from ledgerlm.workspace import Workspace

    base, points = _plan(recipe, set_, sizes, tokens, flops, lr_rule)
    sweep_id = sweep_id_of(base, points, name)
    ws = Workspace(workspace)
    if not as_json:
        console.print(
            f"sweep {escape(sweep_id)}: {_runs(len(points))} of {escape(base.name)}, "
            f"lr rule {escape(lr_rule)}",
            highlight=False,
        )
    with RichProgress(lines=not as_json) as progress:
        found = run_sweep_points(
            base, points, ws, progress, sweep_id=sweep_id, keep_going=keep_going
        )
    if as_json:
        out = {
            "sweep_id": sweep_id,
            "data_version": found.versions[0][0] if found.versions else None,
            "tokens_version": found.versions[0][1] if found.versions else None,
            "points": found.rows(),
            "skipped": found.skipped,
            "bill": found.bill,
        }
        console.print_json(json.dumps(out))
        return
    console.print(_points_table(found, f"sweep {escape(sweep_id)}"))
    if found.bill is not None:  # its runs by how they ended, wall and device time
        print_search_bill({"kind": "sweep", "search_id": sweep_id, "bill": found.bill})
    for run_id, why in found.skipped:
        console.print(f"[red]no point from {escape(run_id)}: {escape(why)}[/]", highlight=False)
    if found.versions:
        data, tokens_version = found.versions[0]
        console.print(
            escape(f"one data version: data {data}, tokens {tokens_version}"), highlight=False
        )
    console.print(f"sweep {escape(sweep_id)}", highlight=False)
    console.print(f"next: ledgerlm scale fit --sweep {escape(sweep_id)}", highlight=False)


def _points_table(found, title: str) -> FitTable:
    t = FitTable(title=title, show_edge=False)
    for col in ("run", "N", "D (tokens)", "final loss"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for row in found.rows():
        t.add_row(escape(row["run"]), f"{row['N']:,}", f"{row['D']:,}", f"{row['loss']:.4f}")
    return t


app.command("fit")(scale_fit.fit_cmd)
app.command("recommend")(scale_fit.recommend_cmd)
app.command("serving-cost")(scale_serving.serving_cost_cmd)
