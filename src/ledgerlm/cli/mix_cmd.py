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
from ledgerlm.cli.render import plan_stage_lines, plan_table, print_search_bill
from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    err_console,
    friendly_errors,
    load_recipe,
)

app = typer.Typer(
    help="Data mixtures: how much of each domain a run sees. Plan the tokens and epochs "
    "per domain, search mixtures with small proxy runs, fit a regression from mixture "
    "weights to loss, and verify the found mixture at the target scale.",
    no_args_is_help=True,
)
app.command("fit")(mix_fit.fit)


#: The library's arguments as the commands' flags: its ``ArgumentError``s name the
#: argument at fault, the console the flag (``friendly_errors(flags=...)``).
PLAN_FLAGS = {"weights": "--weights", "budget_tokens": "--tokens"}
SEARCH_FLAGS = {"proxy": "--proxy", "trials": "--trials", "search_id": "--name"}


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
@friendly_errors(flags=PLAN_FLAGS)
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
    """Plan a mixture before training: tokens and epochs per domain.

    Per domain: the unique pool S (train tokens), the weight p, the expected tokens E[D]
    = p D for the run's token budget D, and the exposure e = p D / S (epochs over the
    domain's unique tokens), with a warning for a domain repeated more than max_epochs
    times.

    D is max_steps x tokens per update (ranks x grad_accum x micro_batch_rows x
    seq_len), capped by eval.budget_tokens. `ledgerlm run` prints the same plan.
    """
    from ledgerlm.mixture.plan import plan_mixture

    if recipe is None:
        if pools is None or weights is None or tokens is None:
            raise ValueError("give a recipe, or --pools, --weights and --tokens")
        mix, pool = _pairs(weights, "--weights"), _pairs(pools, "--pools")
        found = plan_mixture(pool, mix, tokens, max_epochs)
    else:
        from ledgerlm.lab.mixture import plan_recipe
        from ledgerlm.workspace import Workspace

        extra = [f"data.mixture.max_epochs={max_epochs}"] if max_epochs is not None else []
        cfg = load_recipe(recipe, [*(set_ or []), *extra])
        with RichProgress(lines=not as_json) as progress:
            found = plan_recipe(cfg, Workspace(workspace), progress, ranks)
    planned = found.to_dict()
    if as_json:
        console.print_json(json.dumps(planned))
        return
    print_plan(planned)


def _weights_line(weights: dict[str, float]) -> str:
    return ", ".join(f"{d} {w:.3f}" for d, w in weights.items())


def _num(v: float | None, fmt: str = ".4f") -> str:
    return "-" if v is None else format(v, fmt)


@app.command("search")
@friendly_errors(flags=SEARCH_FLAGS)
def search(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file (the target-scale run).")],
    trials: Annotated[
        int,
        typer.Option("--trials", min=3, help="Proxy runs; the first uses the natural mixture."),
    ] = 16,
    proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--proxy",
            help="Override for the proxy runs, section.key=value (repeatable), e.g. "
            "model.d_model=32 train.max_steps=100. [data] and [tokenizer] stay the recipe's.",
        ),
    ] = None,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="What the mixture minimises: loss (overall validation loss), loss/<domain>, "
            "or worst (the largest ratio of a domain's loss to its natural-mixture loss).",
        ),
    ] = "loss",
    concentration: Annotated[
        float | None,
        typer.Option(
            "--concentration",
            min=0.01,
            help="Dirichlet precision of the trial draws around the natural mixture "
            "(alpha = concentration x natural); default: the number of domains.",
        ),
    ] = None,
    model: Annotated[
        str, typer.Option("--model", help="Regression: auto, lightgbm or linear.")
    ] = "auto",
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="regmix: trials and a regression (above); doremi: a reference proxy on the "
            "natural mixture, then one proxy reweighted at each evaluation by exponentiated "
            "gradient on the domains' excess loss (eta 1, smoothing 1e-3), the averaged "
            "weights as the result (--trials, --objective and --model do not apply).",
        ),
    ] = "regmix",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the draws and the fit.")] = 0,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="The search id (its trials are named <name>-tNN). Default: "
            "<recipe>-mix-<6 hex of the search's settings>, so the same command continues it.",
        ),
    ] = None,
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Search a mixture with small proxy runs (RegMix style).

    A baseline on the natural mixture, then mixtures drawn from a Dirichlet around it; a
    regression from the weights to each domain's validation loss (cross-validated), and
    the mixture that minimises the objective among 100,000 draws around the natural
    mixture.

    Every trial is a ledger run named <search id>-tNN. The result (and the search's wall
    time) is kept in mixtures/<search id>.json; a run uses it with --set
    data.mixture.from_search=<search id>, which charges it the search's wall and device
    time as a `search` phase. The search's table (its trials by how they ended, the
    wall time and device-hours of each group) ends the output. `ledgerlm mix verify`
    runs the found and the baseline mixture at scale.

    The record is written before the first trial and as each trial finishes: the same
    command run again continues the search, reusing its finished trials and resuming the
    interrupted one from its checkpoint.
    """
    from ledgerlm.lab.mix_search.doremi import doremi_search
    from ledgerlm.lab.mix_search.regmix import search_mixture
    from ledgerlm.mixture.regress import MODELS
    from ledgerlm.workspace import Workspace

    if model not in MODELS:  # for either method, before the recipe is read
        raise ValueError(f"--model {model!r}: use {', '.join(MODELS[:-1])} or {MODELS[-1]}")
    if method not in ("regmix", "doremi"):
        raise ValueError(f"--method {method!r}: use regmix or doremi")
    base = load_recipe(recipe, set_)
    if method == "doremi":
        with RichProgress(lines=not as_json) as progress:
            record = doremi_search(
                base,
                Workspace(workspace),
                proxy=list(proxy or []),
                progress=progress,
                search_id=name,
            )
        if as_json:
            console.print_json(json.dumps(record))
        else:
            print_doremi(record)
        return
    with RichProgress(lines=not as_json) as progress:
        record = search_mixture(
            base,
            Workspace(workspace),
            trials=trials,
            proxy=list(proxy or []),
            objective=objective,
            concentration=concentration,
            seed=seed,
            model=model,
            progress=progress,
            search_id=name,
        )
    if as_json:
        console.print_json(json.dumps(record))
        return
    print_search(record)


def print_search(record: dict) -> None:
    from ledgerlm.cli.table import FitTable

    t = FitTable(title=f"mixture search {escape(record['search_id'])}", show_edge=False)
    domains = record["domains"]
    for col in ("trial", *domains, "loss", *(f"loss/{d}" for d in domains)):
        t.add_column(escape(col), justify="left" if col == "trial" else "right")
    for i, trial in enumerate(record["trials"]):
        label = f"t{i:02d}" + (" natural" if i == 0 else "")
        t.add_row(
            label,
            *(f"{trial['weights'].get(d, 0.0):.3f}" for d in domains),
            *(_num(trial["metrics"].get(k)) for k in ["loss", *(f"loss/{d}" for d in domains)]),
        )
    console.print(t)
    r = FitTable(title="regressions (cross-validated)", show_edge=False)
    for col in ("target", "model", "folds", "spearman", "mae", "rmse"):
        r.add_column(col, justify="left" if col in ("target", "model") else "right")
    for name, fit in record["regressions"].items():
        cv = fit["cv"]
        r.add_row(
            escape(name),
            escape(fit["model"]),
            str(cv["folds"]),
            _num(cv["spearman"], ".3f"),
            _num(cv["mae"]),
            _num(cv["rmse"]),
        )
    console.print(r)
    from ledgerlm.mixture.recommend import WEAK_SPEARMAN, weak_search

    spearmans = {n: f["cv"]["spearman"] for n, f in record["regressions"].items()}
    weak = weak_search(len(record["trials"]), spearmans)
    if weak is not None:
        err_console.print(
            f"[yellow]warning:[/] {len(record['trials'])} trials"
            + (
                f"; cross-validated Spearman below {WEAK_SPEARMAN:g} for {escape(', '.join(weak))}"
                if weak
                else ""
            )
            + ": the recommendation is weak evidence (RegMix fits hundreds of proxy runs)",
            highlight=False,
        )
    console.print(
        f"objective {escape(record['objective'])}: recommended "
        f"{escape(_weights_line(record['recommended']))} (natural "
        f"{escape(_weights_line(record['natural']))})",
        highlight=False,
    )
    predicted = ", ".join(f"{k} {v:.4f}" for k, v in record["predicted"].items())
    console.print(f"predicted: {escape(predicted)}", highlight=False)
    _print_bill(record)
    console.print(
        f"search wall time {record['seconds']:,.1f} s over {len(record['trials'])} trials; use "
        f"it: --set data.mixture.from_search={escape(record['search_id'])}",
        highlight=False,
    )


def _print_bill(record: dict) -> None:
    """The search's table (its trials by how they ended, wall and device time)."""
    if record.get("bill"):  # a record of older code has none
        print_search_bill({"kind": "mix", **record})


def print_doremi(record: dict) -> None:
    from ledgerlm.cli.table import FitTable

    domains = record["domains"]
    t = FitTable(title=f"DoReMi reweighting {escape(record['search_id'])}", show_edge=False)
    t.add_column("step", justify="right")
    for d in domains:
        t.add_column(escape(d), justify="right")
    for d in domains:
        t.add_column(escape(f"excess {d}"), justify="right")
    for h in record["history"]:
        t.add_row(
            str(h["step"]),
            *(f"{w:.3f}" for w in h["weights"]),
            *(f"{x:.4f}" for x in h["excess"]),
        )
    console.print(t)
    console.print(
        f"averaged weights (the result): {escape(_weights_line(record['recommended']))} "
        f"(natural {escape(_weights_line(record['natural']))})",
        highlight=False,
    )
    _print_bill(record)
    console.print(
        f"reference run {escape(record['reference']['run'])}, proxy run "
        f"{escape(record['proxy_run']['run'])}; search wall time {record['seconds']:,.1f} s; "
        f"use it: --set data.mixture.from_search={escape(record['search_id'])}",
        highlight=False,
    )


@app.command("verify")
@friendly_errors
def verify(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file (the target-scale run).")],
    mixture: Annotated[
        str,
        typer.Option(
            "--mixture",
            help="A JSON/TOML file of domain = weight (or a search's JSON), or a mixture "
            "search id (a unique prefix, or latest).",
        ),
    ],
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Verify a mixture at the target scale, against the baseline mixture.

    Runs the recipe with its own mixture (the baseline) and with the found one, on the
    same budget, and show per domain which gains and which loses, and the time-to-target
    of each (a search's wall time is charged to the found run).

    Both runs train to the full budget (no stop at the target), so their final losses
    compare like for like; the time-to-target is still the first confirmation.
    """
    from ledgerlm.cli.table import FitTable
    from ledgerlm.lab.mix_search.verify import verify_mixture
    from ledgerlm.workspace import Workspace

    base = load_recipe(recipe, set_)
    with RichProgress(lines=not as_json) as progress:
        out = verify_mixture(base, Workspace(workspace), mixture, progress)
    if as_json:
        console.print_json(json.dumps(out))
        return
    t = FitTable(title="validation loss at the same budget", show_edge=False)
    for col in ("domain", "baseline", "found", "change", ""):
        t.add_column(col, justify="left" if col in ("domain", "") else "right")
    for row in out["domains"]:
        d = row["delta"]
        verdict = "" if d is None else ("gains" if d < 0 else "loses" if d > 0 else "same")
        t.add_row(
            escape(row["domain"]),
            _num(row["baseline"]),
            _num(row["found"]),
            "-" if d is None else f"{d:+.4f}",
            verdict,
        )
    console.print(t)
    for label in ("baseline", "found"):
        ttt = out["time_to_target"][label]
        search_s = out["search_seconds"][label]
        reached = (
            f"target reached at step {ttt['step']} after {ttt['seconds']:,.1f} s"
            if ttt["reached"]
            else "target NOT reached"
        )
        extra = f" (search {search_s:,.1f} s included)" if search_s else ""
        console.print(
            f"{label}: run {escape(out['runs'][label])}: {reached}{extra}", highlight=False
        )
