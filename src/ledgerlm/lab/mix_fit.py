"""A mixture regression (RegMix style) fitted on a CSV table of proxy runs.

``fit_table`` reads the table, fits the regression from the domain weights to the
target column (cross-validated), recommends the mixture among Dirichlet draws around
the table's own mixtures, predicts the mixtures of a second table if one is given, and
says when the recommendation is weak evidence (``mixture.recommend.weak_fit``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ledgerlm.mixture.dirichlet import concentration_of
from ledgerlm.mixture.recommend import DEFAULT_CANDIDATES, DEFAULT_TOP_K, recommend, weak_fit
from ledgerlm.mixture.regress import DEFAULT_FOLDS, DEFAULT_SEED, MixtureRegression, fit_regression
from ledgerlm.mixture.table import MixtureTable, read_mixture_table


@dataclass
class TableFit:
    """A regression on a table of runs, its recommendation and predictions."""

    table: MixtureTable
    regression: MixtureRegression
    center: np.ndarray  # the table's mean mixture: the center of the candidate draws
    concentration: float  # estimated from the rows' spread
    candidates: int
    top_k: int  # the best candidates averaged
    recommended: np.ndarray
    predicted: float  # the regression's prediction of the recommended mixture
    other: MixtureTable | None = None  # the table of mixtures to predict, if any
    predictions: np.ndarray | None = None  # of ``other``'s rows, in order
    weak: str | None = None  # why the recommendation is weak evidence, if it is
    warnings: list[str] = field(default_factory=list)  # the tables' and ``weak``


def fit_table(
    path: Path,
    target: str,
    *,
    predict: Path | None = None,
    ignore: Sequence[str] = (),
    model: str = "auto",
    folds: int = DEFAULT_FOLDS,
    seed: int = DEFAULT_SEED,
    candidates: int = DEFAULT_CANDIDATES,
) -> TableFit:
    """Fit ``target`` from the domain weights of the table at ``path`` (every numeric
    column other than ``target`` and ``ignore``), recommend the mixture that minimises it
    (the mean of the ``DEFAULT_TOP_K`` best of ``candidates`` draws around the table's
    mean mixture, at the rows' own concentration), and predict each mixture of the
    table at ``predict`` (the same domain columns)."""
    table = read_mixture_table(path, target, ignore)
    assert table.target is not None
    other = read_mixture_table(predict, None, domains=table.domains) if predict else None
    reg = fit_regression(
        table.weights, table.target, table.domains, model=model, folds=folds, seed=seed
    )
    center = table.weights.mean(axis=0)
    concentration = concentration_of(table.weights)
    best = recommend(reg.predict, center, concentration, candidates=candidates, seed=seed)
    weak = weak_fit(len(table.weights), reg.cv.spearman)
    return TableFit(
        table=table,
        regression=reg,
        center=center,
        concentration=concentration,
        candidates=candidates,
        top_k=min(DEFAULT_TOP_K, candidates),
        recommended=best,
        predicted=float(reg.predict(best[None, :])[0]),
        other=other,
        predictions=reg.predict(other.weights) if other is not None else None,
        weak=weak,
        warnings=[*table.warnings, *(other.warnings if other else []), *([weak] if weak else [])],
    )
