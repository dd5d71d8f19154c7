"""``ledgerlm mix fit``: a mixture regression (RegMix style) from a CSV table of proxy runs:
its cross-validated quality, the mixture it recommends, and predictions for new mixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ledgerlm.cli.table import FitTable
from ledgerlm.cli.ui import JsonOpt, console, err_console, friendly_errors

CsvArg = Annotated[
    Path,
    typer.Option(
        "--csv",
        help="Table of proxy runs, one row per run: a header, one numeric column per domain "
        "weight (each row sums to 1), the result columns, optionally a run-name column.",
    ),
]
TargetOpt = Annotated[
    str,
    typer.Option("--target", help="The column to predict and minimise (e.g. a validation loss)."),
]
PredictOpt = Annotated[
    Path | None,
    typer.Option(
        "--predict",
        help="A second CSV of mixtures (the same domain columns; other columns are ignored): "
        "prints the predicted target of each of its rows, in order.",
    ),
]
IgnoreOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore",
        help="A numeric column that is not a domain weight (another result, a seed); repeatable.",
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        help="auto (LightGBM from 32 rows on, else linear), lightgbm (boosted trees) or "
        "linear (ridge regression on the weights).",
    ),
]
FoldsOpt = Annotated[
    int,
    typer.Option(
        "--folds", min=2, help="Cross-validation folds (leave-one-out when rows < folds)."
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the folds, the model, the draws.")]
CandidatesOpt = Annotated[
    int,
    typer.Option(
        "--candidates",
        min=1,
        help="Candidate mixtures drawn for the recommendation (the 100 best are averaged).",
    ),
]


def _num(x: float | None) -> float | None:
    """JSON has no NaN: a value that is not finite is null."""
    return float(x) if x is not None and math.isfinite(x) else None


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


#: The library's arguments as this command's flags (``friendly_errors(flags=...)``).
FIT_FLAGS = {"target": "--target", "ignore": "--ignore"}


@friendly_errors(flags=FIT_FLAGS)
def fit(
    csv: CsvArg,
    target: TargetOpt,
    predict: PredictOpt = None,
    ignore: IgnoreOpt = None,
    model: ModelOpt = "auto",
    folds: FoldsOpt = 5,
    seed: SeedOpt = 0,
    candidates: CandidatesOpt = 100_000,
    as_json: JsonOpt = False,
) -> None:
    """Fit a regression from domain weights to a target column of a CSV table of runs.

    Every numeric column other than --target and --ignore is a domain weight (rows must
    sum to 1 within 1e-3, or within the rounding of their printed decimals: such rows are
    renormalized and counted in a warning); non-numeric columns (run names) are labels.
    The regression is LightGBM (boosted trees) from 32 rows on, else a ridge regression
    on the weights; its quality is cross-validated: Spearman's rank correlation, MAE and
    RMSE of out-of-fold predictions.

    The recommended mixture follows RegMix: draw --candidates mixtures from a Dirichlet
    around the table's own mixtures (center: the mean row; concentration: estimated from
    the rows' spread), predict each, and average the 100 with the lowest predicted
    target. It therefore stays where runs were made and does not extrapolate far beyond
    them. Fewer than 16 rows or a Spearman below 0.5 make it weak evidence (a warning).
    """
    from ledgerlm.lab.mix_fit import fit_table

    found = fit_table(
        csv,
        target,
        predict=predict,
        ignore=ignore or (),
        model=model,
        folds=folds,
        seed=seed,
        candidates=candidates,
    )
    table, other, reg, predictions = found.table, found.other, found.regression, found.predictions
    rows, cv = len(table.weights), reg.cv

    if as_json:
        out: dict[str, Any] = {
            "rows": rows,
            "domains": table.domains,
            "target": target,
            "model": reg.model,
            "cv": cv.to_dict(),  # folds, spearman, mae, rmse; NaN as null
            "recommended": {
                d: float(w) for d, w in zip(table.domains, found.recommended, strict=True)
            },
            "predicted_target": _num(found.predicted),
            "search": {
                "center": {d: float(w) for d, w in zip(table.domains, found.center, strict=True)},
                "concentration": found.concentration,
                "candidates": found.candidates,
                "top_k": found.top_k,
            },
            "warnings": found.warnings,
        }
        if predictions is not None:
            out["predictions"] = [_num(float(p)) for p in predictions]
        console.print_json(json.dumps(out, allow_nan=False))
    else:
        _print_text(csv, found)
        if other is not None and predictions is not None:
            _print_predictions(predict, other, predictions, target)
    for warning in found.warnings:
        err_console.print(f"[yellow]warning: {escape(warning)}[/]", highlight=False, soft_wrap=True)


def _print_text(csv, found) -> None:
    table, reg, cv = found.table, found.regression, found.regression.cv
    console.print(
        f"read {len(table.weights)} rows x {len(table.domains)} domains from "
        f"{escape(str(csv))}; target {escape(table.target_name)}",
        highlight=False,
        soft_wrap=True,
    )
    if reg.model == "lightgbm":
        s = reg.settings
        detail = (
            f"{s['rounds']} trees of at most {s['num_leaves']} leaves, learning rate "
            f"{s['learning_rate']:g}, at least {s['min_child_samples']} rows per leaf"
        )
    else:
        detail = "ridge regression on the weights"
    console.print(f"model: {reg.model} ({detail})", highlight=False, soft_wrap=True)
    loo = ", leave-one-out" if cv.folds == len(table.weights) else ""
    console.print(
        f"cross-validated ({cv.folds} folds{loo}): Spearman {_fmt(cv.spearman, '.3f')}, "
        f"MAE {_fmt(cv.mae, '.4g')}, RMSE {_fmt(cv.rmse, '.4g')}",
        highlight=False,
        soft_wrap=True,
    )
    t = FitTable(title="recommended mixture", show_edge=False)
    t.add_column("domain")
    t.add_column("recommended", justify="right")
    t.add_column("table mean", justify="right")
    for d, w, m in zip(table.domains, found.recommended, found.center, strict=True):
        t.add_row(escape(d), f"{w:.4f}", f"{m:.4f}")
    console.print(t)
    console.print(
        f"searched {found.candidates:,} Dirichlet draws around the table's mean mixture "
        f"(concentration {found.concentration:.3g}); the mean of the best {found.top_k}",
        highlight=False,
        soft_wrap=True,
    )
    value = _fmt(found.predicted, ".4f")
    console.print(
        f"predicted {escape(table.target_name)} of the recommended mixture: {value}",
        highlight=False,
        soft_wrap=True,
    )


def _print_predictions(path, other, predictions, target) -> None:
    t = FitTable(title=f"predicted {escape(target)} for {escape(str(path))}", show_edge=False)
    t.add_column("row", justify="right")
    if other.names is not None:
        t.add_column("name")
    t.add_column(f"predicted {escape(target)}", justify="right")
    for i, p in enumerate(predictions):
        cells = [str(i + 1)]
        if other.names is not None:
            cells.append(escape(other.names[i]))
        cells.append(_fmt(float(p), ".4f"))
        t.add_row(*cells)
    console.print(t)
