"""``ledgerlm scale``: plan and run sweeps of model size x tokens, fit L(N, D), and
recommend a compute-optimal (and lifecycle-optimal) model for a budget."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

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
SweepOpt = Annotated[
    str | None,
    typer.Option("--sweep", help="Sweep id (a unique prefix, or 'latest') from `scale run`."),
]
RunsOpt = Annotated[
    str | None,
    typer.Option("--runs", help="Runs, comma-separated (ids or unique parts of ids)."),
]
CsvOpt = Annotated[
    Path | None,
    typer.Option("--csv", help="A CSV file with columns N, D, loss (one run per row)."),
]
BootstrapOpt = Annotated[
    int,
    typer.Option(
        "--bootstrap",
        min=0,
        help="Bootstrap refits for the 95% intervals (resampled points); 0: no intervals.",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap resampling.")]


def _numbers(text: str | None, what: str, zero: bool = False) -> list[float] | None:
    if text is None:
        return None
    out = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not a number") from None
        if not (math.isfinite(value) and (value > 0 or (zero and value == 0))):
            kind = "a number >= 0" if zero else "a positive number"
            raise ValueError(f"{what}: {item!r} is not {kind}")
        out.append(value)
    return out


def _plan(recipe_path: Path, set_: list[str] | None, sizes, tokens, flops, lr_rule):
    from ledgerlm.scaling.sweep import plan

    base = load_recipe(recipe_path, set_)
    points = plan(
        base,
        _numbers(sizes, "--sizes") or [],
        _numbers(tokens, "--tokens"),
        _numbers(flops, "--flops"),
        lr_rule=lr_rule,
    )
    return base, points


def _g(x: float) -> str:
    """3 significant digits, exponents without padding: 2e5, 1.2e11."""
    text = f"{x:.3g}"
    mantissa, e, exp = text.partition("e")
    return f"{mantissa}e{int(exp)}" if e else text


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _plan_table(points, title: str) -> Table:
    t = Table(title=title, show_edge=False)
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
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a sweep: every point of `scale plan`, one after another, on one data version.

    The first run prepares (or reuses) the data and tokens versions; every other run must
    reuse them. Each run trains its full budget (no early stop at the target), keeps its
    whole curve in the ledger, is named <sweep id>-<point> and carries a `sweep` event with
    the point, its overrides and the tuning rule. Prints the sweep id for `scale fit`.
    """
    from ledgerlm.lab.sweep import run_sweep, sweep_points
    from ledgerlm.ledger.store import Ledger
    from ledgerlm.scaling.sweep import new_sweep_id
    from ledgerlm.workspace import Workspace

    base, points = _plan(recipe, set_, sizes, tokens, flops, lr_rule)
    sweep_id = new_sweep_id(base)
    ws = Workspace(workspace)
    if not as_json:
        console.print(
            f"sweep {escape(sweep_id)}: {_runs(len(points))} of {escape(base.name)}, "
            f"lr rule {escape(lr_rule)}",
            highlight=False,
        )
    with RichProgress(lines=not as_json) as progress:
        run_sweep(base, points, ws, progress, sweep_id=sweep_id, keep_going=keep_going)
    with Ledger(ws.ledger_path) as ledger:
        found = sweep_points(ledger, sweep_id, ws)
    if as_json:
        out = {
            "sweep_id": sweep_id,
            "data_version": found.versions[0][0] if found.versions else None,
            "tokens_version": found.versions[0][1] if found.versions else None,
            "points": found.rows(),
            "skipped": found.skipped,
        }
        console.print_json(json.dumps(out))
        return
    console.print(_points_table(found, f"sweep {escape(sweep_id)}"))
    for run_id, why in found.skipped:
        console.print(f"[red]no point from {escape(run_id)}: {escape(why)}[/]", highlight=False)
    if found.versions:
        data, tokens_version = found.versions[0]
        console.print(
            escape(f"one data version: data {data}, tokens {tokens_version}"), highlight=False
        )
    console.print(f"sweep {escape(sweep_id)}", highlight=False)
    console.print(f"next: ledgerlm scale fit --sweep {escape(sweep_id)}", highlight=False)


def _points_table(found, title: str) -> Table:
    t = Table(title=title, show_edge=False)
    for col in ("run", "N", "D (tokens)", "final loss"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for row in found.rows():
        t.add_row(escape(row["run"]), f"{row['N']:,}", f"{row['D']:,}", f"{row['loss']:.4f}")
    return t


# -- fit and recommend ----------------------------------------------------------------


def _load(sweep, runs, csv, workspace):
    """(N, D, loss) from exactly one source (``lab.scaling.load_points``)."""
    from ledgerlm.lab.scaling import load_points

    if sum(1 for v in (sweep, runs, csv) if v) != 1:
        raise ValueError(
            "give exactly one source of points: --sweep ID, --runs R1,R2,... or --csv FILE"
        )
    return load_points(sweep, runs, csv, workspace=workspace)


def _params_table(result: dict[str, Any]) -> Table:
    t = Table(
        title=f"L(N, D) = E + A N^-alpha + B D^-beta, {result['n_points']} points", show_edge=False
    )
    t.add_column("param")
    t.add_column("value", justify="right")
    level = f"{100 * result['level']:.0f}% interval"
    t.add_column(level, justify="right")
    for name, value in result["params"].items():
        iv = result["intervals"].get(name)
        t.add_row(name, f"{value:.4g}", "-" if iv is None else f"{iv[0]:.4g} .. {iv[1]:.4g}")
    return t


def _range_line(rng: dict[str, list[float]]) -> str:
    return "fitted range: " + ", ".join(
        f"{k} {rng[k][0]:.3g} .. {rng[k][1]:.3g}" for k in ("N", "D", "C")
    )


@app.command("fit")
@friendly_errors
def fit_cmd(
    sweep: SweepOpt = None,
    runs: RunsOpt = None,
    csv: CsvOpt = None,
    bootstrap: BootstrapOpt = 200,
    seed: SeedOpt = 0,
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Also write a self-contained HTML page: loss vs compute with the fitted "
            "frontier and its bootstrap band, isoFLOP curves, residuals.",
        ),
    ] = None,
) -> None:
    """Fit L(N, D) = E + A N^-alpha + B D^-beta to a sweep, a list of runs or a CSV.

    The fit is a Huber loss on log loss from many starting points (Hoffmann et al. 2022,
    approach 3). It prints the five parameters with bootstrap 95% intervals, the residual
    RMS (log loss) and the fitted range of N, D and C: predictions outside it are
    extrapolations. Points from the ledger: N as the sweep plan counts it, D the tokens the
    run consumed, loss its final validation loss. Needs at least 5 distinct (N, D) points.
    """
    from ledgerlm.lab.scaling import fit_points, fit_summary, write_fit_report

    points = _load(sweep, runs, csv, workspace)
    law, boot = fit_points(points, bootstrap, seed)
    result = fit_summary(points, law, boot)
    if report is not None:
        write_fit_report(report, points, law, boot)
        result["report"] = str(report)
    if as_json:
        console.print_json(json.dumps(result))
        return
    console.print(_params_table(result))
    console.print(
        f"residual RMS {result['residual_rms_log']:.4f} (log loss), max "
        f"{result['residual_max_abs_log']:.4f}; {result['n_points']} points from "
        f"{escape(points.describe())}",
        highlight=False,
    )
    console.print(_range_line(result["range"]), highlight=False)
    for warning in result["warnings"]:
        console.print(f"[yellow]note: {escape(warning)}[/]", highlight=False, soft_wrap=True)
    if points.skipped:
        shown = ", ".join(f"{r} ({why})" for r, why in points.skipped[:5])
        console.print(f"left out: {escape(shown)}", highlight=False, soft_wrap=True)


@app.command("recommend")
@friendly_errors
def recommend_cmd(
    budget: Annotated[
        float,
        typer.Option(
            "--budget",
            help="Compute budget C in FLOPs: training alone (C = 6 N D) for N*, D*; training "
            "plus the requests in the lifecycle table.",
        ),
    ],
    sweep: SweepOpt = None,
    runs: RunsOpt = None,
    csv: CsvOpt = None,
    requests: Annotated[
        str | None,
        typer.Option(
            "--requests",
            help="Future inference requests R, comma-separated (e.g. 0,1e6,1e9): adds the "
            "lifecycle table, the (N, D) minimising loss when training plus R requests "
            "share the budget.",
        ),
    ] = None,
    tokens_per_request: Annotated[
        float,
        typer.Option(
            "--tokens-per-request",
            help="Tokens one request processes (prompt + generated); each costs 2 N FLOPs.",
        ),
    ] = 1000.0,
    bootstrap: BootstrapOpt = 200,
    seed: SeedOpt = 0,
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Recommend a model size N* and token count D* for a compute budget.

    Fits the law (as `scale fit`), then takes the compute-optimal split of C = 6 N D,
    where alpha A N^-alpha = beta B D^-beta, with 95% intervals carried through the
    bootstrap. A budget or an optimum outside the fitted range is flagged as an
    extrapolation. With --requests, the lifecycle table: C_total = C_train + R x 2 N x
    tokens per request held at the budget, one row per R; the more requests, the smaller
    the model and the more tokens it is trained on.
    """
    from ledgerlm.lab.scaling import fit_points, recommend

    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"--budget: {budget!r} is not a positive number of FLOPs")
    requests_list = _numbers(requests, "--requests", zero=True)
    if not (math.isfinite(tokens_per_request) and tokens_per_request > 0):
        raise ValueError("--tokens-per-request must be a positive number")
    points = _load(sweep, runs, csv, workspace)
    law, boot = fit_points(points, bootstrap, seed)
    result = recommend(points, law, boot, budget, requests_list, tokens_per_request)
    if as_json:
        console.print_json(json.dumps(result))
        return
    _print_recommendation(result, points)


def _interval_text(entry: dict[str, float], fmt: str) -> str:
    text = format(entry["point"], fmt)
    if "lo" in entry:
        text += f"  (95%: {format(entry['lo'], fmt)} .. {format(entry['hi'], fmt)})"
    return text


def _print_recommendation(result, points) -> None:
    rows = result["lifecycle"]["rows"] if "lifecycle" in result else None
    console.print(
        f"compute budget C = {result['budget']:.3g} FLOPs (C = 6 N D), law fitted on "
        f"{escape(points.describe())}",
        highlight=False,
    )
    t = Table(title="compute-optimal allocation", show_edge=False)
    t.add_column("")
    t.add_column("value", justify="left")
    t.add_row("N* (parameters)", _interval_text(result["N_opt"], ".4g"))
    t.add_row("D* (tokens)", _interval_text(result["D_opt"], ".4g"))
    t.add_row("D*/N*", _interval_text(result["tokens_per_param"], ".3g"))
    t.add_row("predicted loss", _interval_text(result["loss"], ".4f"))
    console.print(t)
    console.print(
        f"N* = {result['N_opt']['point']:.4g}, D* = {result['D_opt']['point']:.4g}", highlight=False
    )
    if result["extrapolation"]:
        console.print(
            f"[yellow]warning: {escape(result['extrapolation'])}[/]",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print("inside the fitted range (no extrapolation)", highlight=False)
    for warning in result["fit"]["warnings"]:
        console.print(f"[yellow]note: {escape(warning)}[/]", highlight=False, soft_wrap=True)
    if rows:
        lt = Table(
            title=f"lifecycle: training + R requests of "
            f"{result['lifecycle']['tokens_per_request']:,.0f} tokens within C",
            show_edge=False,
        )
        for col in ("R", "N", "D", "D/N", "C_train", "C_inference", "loss"):
            lt.add_column(col, justify="right")
        starved = []
        for r in rows:
            if r["D"] < 1:  # serving the requests takes the whole budget
                starved.append(_g(r["R"]))
                lt.add_row(_g(r["R"]), "-", "-", "-", "-", _g(r["C_inference_total"]), "-")
                continue
            lt.add_row(
                _g(r["R"]),
                f"{r['N']:.4g}",
                f"{r['D']:.4g}",
                f"{r['tokens_per_param']:.3g}",
                _g(r["C_train"]),
                _g(r["C_inference_total"]),
                f"{r['loss']:.4f}",
            )
        console.print(lt)
        if starved:
            console.print(
                f"R = {', '.join(starved)}: serving the requests takes the whole budget; no "
                "model trains on even one token",
                highlight=False,
            )
