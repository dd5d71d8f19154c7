"""``ledgerlm scale fit`` and ``scale recommend``: the law fitted on a sweep, runs or a CSV
table, with what was done to the points, its diagnostics and held-out errors; and the
compute-optimal and lifecycle allocations of a budget with intervals and flags."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import DEFAULT_WS, JsonOpt, WorkspaceOpt, console, friendly_errors
from ledgerlm.cli.ui import fmt_g as _g

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
    typer.Option(
        "--csv",
        help="A CSV table, one run per row. Columns found by name: N (N, params, Model "
        "Size), D (D, tokens) or compute C (C, flops, Training FLOP; D = C / 6N), loss "
        "(loss, val_loss), lr (lr, learning_rate); or named with --n-col etc. Epoch AI's "
        "Chinchilla table reads as it is.",
    ),
]


def _col(name: str, what: str) -> Any:
    return Annotated[str | None, typer.Option(f"--{name}-col", help=f"CSV column of {what}.")]


NCol = _col("n", "the parameter count N")
DCol = _col("d", "the training tokens D")
CCol = _col("c", "the training compute C (then D = C / 6N)")
LossCol = _col("loss", "the final validation loss")
LrCol = _col("lr", "the learning rate (replicates of an (N, D) with several lrs: --reduce best)")
BudgetCol = _col("budget", "the isoFLOP budget label of each row (groups the isoFLOP profiles)")
ParamsOpt = Annotated[
    str,
    typer.Option(
        "--params",
        help="Sweeps and runs: what N counts. forward = the weights the forward pass "
        "multiplies by (blocks, final norm, output head; the N of C = 6ND); total = every "
        "parameter, the token embedding included.",
    ),
]
ReduceOpt = Annotated[
    str | None,
    typer.Option(
        "--reduce",
        help="Rows sharing (N, D): best (keep the lowest loss: a tuning sweep), mean, or "
        "none (keep all; the bootstrap resamples (N, D) groups). Default: best when rows "
        "carry differing learning rates, else none.",
    ),
]
DropTopOpt = Annotated[
    int,
    typer.Option(
        "--drop-top-loss", min=0, help="Leave out the K highest losses (listed) before fitting."
    ),
]
MaxResidualOpt = Annotated[
    float | None,
    typer.Option(
        "--max-residual",
        help="Fit, leave out points whose |log residual| exceeds this (listed), refit.",
    ),
]
HoldoutOpt = Annotated[
    str | None,
    typer.Option(
        "--holdout",
        help="Hold out the points matching a rule (N, D, C, D/N or loss; >=, <=, >, <), e.g. "
        "'C>=1e20': not fitted, scored (MAE, RMSE, signed bias, max relative error).",
    ),
]
HoldoutTopOpt = Annotated[
    int,
    typer.Option("--holdout-top", min=0, help="Hold out the K (N, D) points of largest compute."),
]
BootstrapOpt = Annotated[
    int,
    typer.Option(
        "--bootstrap",
        min=0,
        help="Bootstrap refits for the 95% intervals (resampling (N, D) groups); 0: none.",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the bootstrap resampling.")]


def _fit(sweep, runs, csv, workspace, columns, params, options):
    """Points from exactly one source, fitted (``lab.scaling.points.load_points`` and
    ``lab.scaling.fit.fit``)."""
    from ledgerlm.lab.scaling.fit import fit
    from ledgerlm.lab.scaling.points import load_points

    points = load_points(sweep, runs, csv, workspace=workspace, columns=columns, params=params)
    return fit(points, options)


def _options(reduce, drop_top_loss, max_residual, holdout, holdout_top, bootstrap, seed):
    """The fit's options, refused before any point is read (``FitOptions``)."""
    from ledgerlm.lab.scaling.fit import FitOptions

    return FitOptions(reduce, drop_top_loss, max_residual, holdout, holdout_top, bootstrap, seed)


def numbers(text: str | None, what: str) -> list[float] | None:
    """``1e5,2e5,...`` (numbers may be written 1_000_000) as positive numbers."""
    if text is None:
        return None
    out = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"{what}: {item!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{what}: {item!r} is not a positive number")
        out.append(value)
    return out


def _params_table(result: dict[str, Any]) -> FitTable:
    t = FitTable(
        title=f"L(N, D) = E + A N^-alpha + B D^-beta, {result['n_points']} points", show_edge=False
    )
    for col in ("param", "value", f"{100 * result['level']:.0f}% interval", "identified"):
        t.add_column(col, justify="left" if col in ("param", "identified") else "right")
    status = {p["name"]: p["status"] for p in result["diagnostics"]["params"]}
    colour = {"identified": "green", "weakly identified": "yellow", "degenerate": "red"}
    for name, value in result["params"].items():
        iv = result["intervals"].get(name)
        s = status[name]
        t.add_row(
            name,
            f"{value:.4g}",
            "-" if iv is None else f"{iv[0]:.4g} .. {iv[1]:.4g}",
            f"[{colour[s]}]{s}[/]",
        )
    return t


def _range_line(rng: dict[str, list[float]]) -> str:
    return "fitted range: " + ", ".join(
        f"{k} {rng[k][0]:.3g} .. {rng[k][1]:.3g}" for k in ("N", "D", "C", "D/N")
    )


def _note(text: str) -> None:
    console.print(f"[yellow]note: {escape(text)}[/]", highlight=False, soft_wrap=True)


def _dropped_table(rows: list[dict[str, Any]]) -> FitTable:
    t = FitTable(title="left out of the fit", show_edge=False)
    for col in ("point", "N", "D", "loss", "why"):
        t.add_column(col, justify="right" if col in ("N", "D", "loss") else "left")
    for r in rows:
        t.add_row(escape(r["point"]), _g(r["N"]), _g(r["D"]), f"{r['loss']:.4f}", escape(r["why"]))
    return t


def _held_out_table(held: dict[str, Any]) -> FitTable:
    t = FitTable(
        title=f"held out ({escape(held['rule'])}): {held['n']} points, MAE {held['mae']:.4f}, "
        f"RMSE {held['rmse']:.4f}, bias {held['bias']:+.4f} nat/token, max relative error "
        f"{100 * held['max_rel_error']:.2f}%",
        show_edge=False,
    )
    for col in ("point", "N", "D", "loss", "predicted", "error", "rel.", "extrapolated"):
        t.add_column(col, justify="left" if col == "point" else "right")
    for p in held["points"]:
        t.add_row(
            escape(p["point"]),
            _g(p["N"]),
            _g(p["D"]),
            f"{p['loss']:.4f}",
            f"{p['predicted']:.4f}",
            f"{p['error']:+.4f}",
            f"{100 * p['relative_error']:.2f}%",
            "yes" if p["extrapolated"] else "",
        )
    return t


def print_fit(result: dict[str, Any], where: str) -> None:
    """The fit summary (``lab.scaling.summary.fit_summary``) as tables and notes."""
    head = f"{where}: {result['n_loaded']} rows"
    if result["dropped"]:
        head += f", {len(result['dropped'])} left out (below)"
    if result["held_out"]:
        head += f", {result['held_out']['n']} held out ({result['held_out']['rule']})"
    head += f"; fitted on {result['reduction']['note']}"
    console.print(escape(head), highlight=False, soft_wrap=True)
    if result["dropped"]:
        console.print(_dropped_table(result["dropped"]))
    console.print(_params_table(result))
    console.print(
        f"fit {result['diagnostics']['status']}; residual RMS {result['residual_rms_log']:.4f} "
        f"(log loss), max {result['residual_max_abs_log']:.4f}; bootstrap "
        f"{result['bootstrap']} refits over (N, D) groups",
        highlight=False,
    )
    console.print(_range_line(result["range"]), highlight=False)
    iso = result["isoflop"]
    if iso["fitted"]:
        console.print(
            f"isoFLOP: {iso['budgets']} budgets, {iso['grouped']} points grouped, N_opt ~ "
            f"C^{iso['a']:.3f}; {escape(iso['rule'])}",
            highlight=False,
            soft_wrap=True,
        )
    if result["held_out"]:
        console.print(_held_out_table(result["held_out"]))
    for warning in result["warnings"]:
        _note(warning)
    if result["skipped"]:
        shown = ", ".join(f"{r} ({why})" for r, why in result["skipped"][:5])
        console.print(f"left out: {escape(shown)}", highlight=False, soft_wrap=True)


# what the library's argument errors name, as these commands' flags
SOURCE_FLAGS = {"sweep": "--sweep", "runs": "--runs", "csv": "--csv"}
COLUMN_FLAGS = {f"{q}_col": f"--{q}-col" for q in ("n", "d", "c", "loss", "lr", "budget")}
FIT_FLAGS = {**SOURCE_FLAGS, **COLUMN_FLAGS, "holdout": "--holdout",
             "drop_top_loss": "--drop-top-loss", "reduce": "--reduce",
             "max_residual": "--max-residual"}  # fmt: skip
RECOMMEND_FLAGS = {**FIT_FLAGS, "budget": "--budget", "requests": "--requests",
                   "tokens_per_request": "--tokens-per-request", "serving": "--serving",
                   "inference_kappa": "--serving-flops-per-param"}  # fmt: skip


@friendly_errors(flags=FIT_FLAGS)
def fit_cmd(
    sweep: SweepOpt = None,
    runs: RunsOpt = None,
    csv: CsvOpt = None,
    n_col: NCol = None,
    d_col: DCol = None,
    c_col: CCol = None,
    loss_col: LossCol = None,
    lr_col: LrCol = None,
    budget_col: BudgetCol = None,
    params: ParamsOpt = "forward",
    reduce: ReduceOpt = None,
    drop_top_loss: DropTopOpt = 0,
    max_residual: MaxResidualOpt = None,
    holdout: HoldoutOpt = None,
    holdout_top: HoldoutTopOpt = 0,
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
    approach 3). It prints what was done to the points (replicates reduced, outliers and
    held-out points left out, each listed), the five parameters with bootstrap 95%
    intervals and whether the points identify each (E driven to ~0, an exponent's
    interval reaching 0, intervals spanning orders of magnitude, estimates beyond the
    search grid), the residual RMS, the fitted range of N, D, C and D/N (predictions
    outside it are extrapolations), the isoFLOP grouping and the held-out errors. Needs
    at least 5 distinct (N, D) points.
    """
    from ledgerlm.lab.scaling.page import write_fit_report
    from ledgerlm.lab.scaling.summary import fit_summary

    columns = {"n_col": n_col, "d_col": d_col, "c_col": c_col, "loss_col": loss_col,
               "lr_col": lr_col, "budget_col": budget_col}  # fmt: skip
    options = _options(reduce, drop_top_loss, max_residual, holdout, holdout_top, bootstrap, seed)
    fitted = _fit(sweep, runs, csv, workspace, columns, params, options)
    result = fit_summary(fitted)
    if report is not None:
        write_fit_report(report, fitted)
        result["report"] = str(report)
    if as_json:
        console.print_json(json.dumps(result))
        return
    print_fit(result, fitted.describe())


@friendly_errors(flags=RECOMMEND_FLAGS)
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
    n_col: NCol = None,
    d_col: DCol = None,
    c_col: CCol = None,
    loss_col: LossCol = None,
    lr_col: LrCol = None,
    params: ParamsOpt = "forward",
    reduce: ReduceOpt = None,
    drop_top_loss: DropTopOpt = 0,
    max_residual: MaxResidualOpt = None,
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
            help="Tokens one request processes (prompt + generated).",
        ),
    ] = 1000.0,
    serving_kappa: Annotated[
        float | None,
        typer.Option(
            "--serving-flops-per-param",
            help="Serving FLOPs per parameter per token (default 2: a forward pass). "
            "`scale serving-cost` measures it with attention over the context and the batch.",
        ),
    ] = None,
    serving: Annotated[
        Path | None,
        typer.Option(
            "--serving",
            help="A `scale serving-cost -o` file: its measured training-equivalent serving "
            "FLOPs per parameter per token (batch and context included) become k. "
            "Instead of --serving-flops-per-param.",
        ),
    ] = None,
    bootstrap: BootstrapOpt = 200,
    seed: SeedOpt = 0,
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Recommend a model size N* and token count D* for a compute budget.

    Fits the law (as `scale fit`), then takes the compute-optimal split of C = 6 N D,
    where alpha A N^-alpha = beta B D^-beta, with 95% intervals carried through the
    bootstrap. A budget or an optimum outside the fitted range of N, D, C or tokens per
    parameter D/N is flagged as an extrapolation. With --requests, the lifecycle table:
    C_total = C_train + R x k N x tokens per request held at the budget (k: serving FLOPs
    per parameter per token), one row per R, each with its interval and flag; the more
    requests, the smaller the model and the more tokens it is trained on.
    """
    from ledgerlm.lab.scaling.recommend import check_budget, recommend

    requests_list = check_budget(budget, requests, tokens_per_request)  # before the fit
    columns = {"n_col": n_col, "d_col": d_col, "c_col": c_col, "loss_col": loss_col,
               "lr_col": lr_col}  # fmt: skip
    options = _options(reduce, drop_top_loss, max_residual, None, 0, bootstrap, seed)
    fitted = _fit(sweep, runs, csv, workspace, columns, params, options)
    result = recommend(fitted, budget, requests_list, tokens_per_request, serving_kappa, serving)
    if as_json:
        console.print_json(json.dumps(result))
        return
    _print_recommendation(result, fitted.describe())
    if "lifecycle" in result:
        used = result["lifecycle"]["serving"]
        k = f"{used['flops_per_param']:.3g} N FLOPs a served token"
        if used["kind"] == "measured":
            line = (
                f"serving cost: {k}, measured by `scale serving-cost` on {used['source']} "
                f"(batch {used['batch']}, context {used['context']}, {used['machine']}; "
                f"training-equivalent, analytic {used['analytic_flops_per_param']:.3g}) "
                f"from {used['file']}"
            )
        elif used["kind"] == "stated":
            line = f"serving cost: {k}, stated with --serving-flops-per-param"
        else:
            line = f"serving cost: {k} (default: one forward pass, context and batch left out)"
        console.print(escape(line), highlight=False, soft_wrap=True)


def _interval_text(entry: dict[str, float], fmt: str) -> str:
    text = format(entry["point"], fmt)
    if "lo" in entry:
        text += f"  (95%: {format(entry['lo'], fmt)} .. {format(entry['hi'], fmt)})"
    return text


def _band(value: float, band: dict[str, Any] | None, key: str, fmt: str | None = None) -> str:
    """``value`` over ``(lo .. hi)``, compact: 3 significant digits (or ``fmt``); the
    interval wraps at its spaces, never inside a number."""
    show = _g if fmt is None else (lambda x: format(x, fmt))
    text = show(value)
    if band and key in band:
        lo, hi = band[key]
        text += f"\n({show(lo)} .. {show(hi)})"
    return text


def _print_recommendation(result: dict[str, Any], where: str) -> None:
    console.print(
        f"compute budget C = {result['budget']:.3g} FLOPs (C = 6 N D), law fitted on "
        f"{escape(where)} ({result['fit']['diagnostics']['status']})",
        highlight=False,
    )
    t = FitTable(title="compute-optimal allocation", show_edge=False)
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
        _note(warning)
    if "lifecycle" in result:
        _print_lifecycle(result["lifecycle"])


def _print_lifecycle(life: dict[str, Any]) -> None:
    from ledgerlm.lab.scaling.recommend import trains

    lt = FitTable(
        title=f"lifecycle: training + R requests of {life['tokens_per_request']:,.0f} tokens "
        f"({life['inference_kappa']:g} N FLOPs a token) within C; 95% intervals below; "
        "! = extrapolation",
        show_edge=False,
    )
    for col in ("R", "N", "D", "D/N", "training", "loss"):
        lt.add_column(col, justify="right")
    starved, flagged = [], []
    for r in life["rows"]:
        if not trains(r):  # serving the requests takes the whole budget
            starved.append(_g(r["R"]))
            lt.add_row(_g(r["R"]), "-", "-", "-", "0%", "-")
            continue
        band = r.get("interval")
        if r["extrapolation"]:
            flagged.append(f"R = {_g(r['R'])}: {r['extrapolation']}")
        lt.add_row(
            _g(r["R"]) + (" [yellow]![/]" if r["extrapolation"] else ""),
            _band(r["N"], band, "N"),
            _band(r["D"], band, "D"),
            _band(r["tokens_per_param"], band, "tokens_per_param"),
            f"{100 * r['C_train'] / r['C_total']:.0f}%",
            _band(r["loss"], band, "loss", ".3f"),
        )
    console.print(lt)
    for line in flagged:
        console.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    if starved:
        console.print(
            f"R = {', '.join(starved)}: serving the requests takes the whole budget; no "
            "model trains on even one token",
            highlight=False,
        )
