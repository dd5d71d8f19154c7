"""Scaling-law fits of the lab's runs (SPEC S2-S4), as ``ledgerlm scale fit`` and
``ledgerlm scale recommend`` compute them; the CLI only parses arguments and prints.

- ``load_points``: the (N, D, loss) points of a sweep, a list of runs (read back from the
  ledger by ``ledgerlm.lab.sweep.sweep_points``) or a CSV file, with where they came from.
- ``fit_points``: the fit of L(N, D) = E + A N^-alpha + B D^-beta and its bootstrap, or
  one clear error (too few distinct points, a failed or non-finite fit).
- ``fit_summary``: the fit as a JSON-able dict (parameters, intervals, residuals, fitted
  range, a warning when the points barely determine the five parameters).
- ``write_fit_report``: the fit as a self-contained HTML page, written atomically.
- ``recommend``: the compute-optimal N* and D* for a budget with bootstrap intervals, an
  extrapolation warning, and the lifecycle table for future inference requests.

The estimator and the allocation maths are ``ledgerlm.scaling.fit`` and
``ledgerlm.scaling.allocate``; the page is ``ledgerlm.report.scaling_report``. Those (and
scipy with them) are imported only when a fit, a recommendation or a page is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ledgerlm.workspace import DEFAULT_WORKSPACE, Workspace, atomic_write_text

if TYPE_CHECKING:
    from ledgerlm.scaling.fit import Bootstrap, ScalingLaw

MIN_POINTS = 5  # five parameters: E, A, B, alpha, beta
LAW = "L(N, D) = E + A N^-alpha + B D^-beta (Huber on log loss)"
_FIT_KEYS = ("params", "intervals", "residual_rms_log", "range", "n_distinct", "warnings")


def describe_source(source: dict[str, Any]) -> str:
    """Where points came from, in words: ``sweep <id>``, the CSV path or ``runs a, b``."""
    if "sweep" in source:
        return f"sweep {source['sweep']}"
    if "csv" in source:
        return source["csv"]
    return f"runs {', '.join(source['runs'])}"


@dataclass
class FitPoints:
    """(N, D, loss) points to fit, and where they came from; unpacks as ``N, D, loss``.

    ``source`` is ``{"sweep": id}``, ``{"runs": [refs]}`` or ``{"csv": path}``; ``runs``
    one row (run, N, D, loss) per point read from the ledger (none from a CSV);
    ``skipped`` the ``[run id, reason]`` of the runs with no final point.
    """

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    source: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[list[str]] = field(default_factory=list)

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def __len__(self) -> int:
        return len(self.N)

    def distinct(self) -> int:
        """How many distinct (N, D) pairs there are (repeated seeds count once)."""
        return len(set(zip(self.N.tolist(), self.D.tolist(), strict=True)))

    def describe(self) -> str:
        """Where the points came from, in words (see ``describe_source``)."""
        return describe_source(self.source)


def load_points(
    sweep: str | None = None,
    runs: str | Sequence[str] | None = None,
    csv: str | Path | None = None,
    *,
    workspace: Workspace | str | Path = DEFAULT_WORKSPACE,
) -> FitPoints:
    """(N, D, loss) from exactly one source: a sweep (id, unique prefix or ``latest``),
    runs (ids or unique prefixes; a string is split on commas) or a CSV file with columns
    N, D, loss. Sweeps and runs are read from the workspace's ledger: N as the sweep plan
    counts it, D the tokens each run consumed, loss its final validation loss."""
    if sum(1 for v in (sweep, runs, csv) if v) != 1:
        raise ValueError("give exactly one source of points: a sweep, runs or a CSV file")
    if csv is not None:
        from ledgerlm.scaling.fit import load_points_csv

        csv = Path(csv)
        if not csv.is_file():
            raise FileNotFoundError(f"{csv}: no such file")
        N, D, loss = load_points_csv(csv)
        return FitPoints(N, D, loss, {"csv": str(csv)})

    from ledgerlm.lab.sweep import sweep_points
    from ledgerlm.ledger.store import Ledger

    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    if not ws.ledger_path.is_file():
        raise FileNotFoundError(f"{ws.ledger_path}: no ledger here (run a sweep first)")
    with Ledger(ws.ledger_path) as ledger:
        if sweep:
            found = sweep_points(ledger, sweep, ws)
            source: dict[str, Any] = {"sweep": found.sweep_id}
        else:
            items = runs.split(",") if isinstance(runs, str) else runs
            refs = [r.strip() for r in items if r.strip()]
            found = sweep_points(ledger, refs, ws)
            source = {"runs": refs}
    N, D, loss = (np.asarray(x, dtype=np.float64) for x in found)
    return FitPoints(N, D, loss, source, found.rows(), [list(s) for s in found.skipped])


def fit_points(
    points: FitPoints, n_boot: int = 200, seed: int = 0
) -> tuple[ScalingLaw, Bootstrap | None]:
    """The fitted law and its bootstrap of ``n_boot`` refits (None when ``n_boot`` is 0).

    Raises ``ValueError`` (one line naming the source) for fewer than ``MIN_POINTS``
    distinct (N, D) points, a fit that fails, or non-finite parameters.
    """
    from ledgerlm.scaling.fit import ScalingLaw

    distinct = points.distinct()
    where = points.describe()
    skipped = f" ({len(points.skipped)} runs without a final loss left out)"
    if distinct < MIN_POINTS:
        raise ValueError(
            f"{where}: the fit of E, A, B, alpha, beta needs at least {MIN_POINTS} points with "
            f"distinct (N, D), got {distinct}{skipped if points.skipped else ''}"
        )
    try:
        law = ScalingLaw().fit(points.N, points.D, points.loss)
        boot = law.bootstrap(n=n_boot, seed=seed) if n_boot else None
    except (RuntimeError, FloatingPointError, ValueError) as exc:
        raise ValueError(f"{where}: the fit failed: {exc}") from None
    values = law.params_.as_array()
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{where}: the fit failed (non-finite parameters)")
    return law, boot


def fit_summary(
    points: FitPoints, law: ScalingLaw, boot: Bootstrap | None, level: float = 0.95
) -> dict[str, Any]:
    """The fit as a JSON-able dict: source, point counts, warnings, parameters with their
    bootstrap intervals at ``level``, log residuals, fitted range, runs and skipped runs.
    """
    intervals = boot.intervals(level) if boot is not None else {}
    r = np.asarray(law.residuals_, dtype=np.float64)
    distinct = points.distinct()
    warnings = []
    if distinct < 2 * MIN_POINTS:
        warnings.append(
            f"{distinct} distinct points for 5 parameters: the fit is barely determined, "
            "read its parameters and intervals with care"
        )
    return {
        "source": points.source,
        "n_points": len(points.N),
        "n_distinct": distinct,
        "warnings": warnings,
        "law": LAW,
        "params": law.params_.to_dict(),
        "level": level,
        "bootstrap": 0 if boot is None else len(boot.samples),
        "intervals": {k: list(v) for k, v in intervals.items()},
        "residual_rms_log": float(np.sqrt(np.mean(r * r))),
        "residual_max_abs_log": float(np.max(np.abs(r))),
        "residuals_log": r.tolist(),
        "range": {k: list(v) for k, v in law.range_.items()},
        "runs": points.runs,
        "skipped": points.skipped,
    }


def write_fit_report(
    path: str | Path, points: FitPoints, law: ScalingLaw, boot: Bootstrap | None
) -> None:
    """The fit as a self-contained HTML page at ``path``, written atomically: loss against
    compute with the fitted frontier and its bootstrap band, isoFLOP curves when budgets
    repeat (the page says so when none does), residuals."""
    from ledgerlm.report.scaling_report import render_scaling_report
    from ledgerlm.scaling.fit import isoflop_fit

    path = Path(path)
    N, D, loss = points
    try:
        iso = isoflop_fit(N, D, loss)
    except ValueError:  # no budget with enough points: the page says so
        iso = None
    title = f"ledgerlm scaling fit: {points.describe()}"
    page = render_scaling_report(N, D, loss, law, boot=boot, isoflop=iso, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, page)


def recommend(
    points: FitPoints,
    law: ScalingLaw,
    boot: Bootstrap | None,
    budget: float,
    requests: Sequence[float] | None = None,
    tokens_per_request: float = 1000.0,
) -> dict[str, Any]:
    """The compute-optimal allocation of a budget C (FLOPs, C = 6 N D) under the fitted
    law, as a JSON-able dict.

    ``N_opt``, ``D_opt``, ``tokens_per_param`` and the predicted ``loss``: each a
    ``point``, with ``lo``/``hi`` carried through the bootstrap when there is one (then
    also ``level`` and ``n_valid_samples``); ``extrapolation``: a warning when the
    budget or the optimum lies outside the fitted range, else None. With ``requests``
    (future inference requests R, each of ``tokens_per_request`` tokens at 2 N FLOPs a
    token), ``lifecycle``: one row per R of the (N, D) minimising loss when training and
    serving share the budget. Then ``fit`` (the summary's parameters, intervals,
    residual RMS, range, distinct points and warnings) and ``source``.
    """
    from ledgerlm.scaling.allocate import (
        allocation_with_interval,
        compute_optimal,
        extrapolation_warning,
        lifecycle_table,
    )

    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget {budget!r} is not a positive number of FLOPs")
    if not (math.isfinite(tokens_per_request) and tokens_per_request > 0):
        raise ValueError(f"tokens per request {tokens_per_request!r} is not a positive number")
    fitted = fit_summary(points, law, boot)
    n_opt, d_opt = (float(x) for x in compute_optimal(law.params_, budget))
    loss = float(law.params_.predict(n_opt, d_opt))
    result: dict[str, Any] = {
        "budget": budget,
        "N_opt": {"point": n_opt},
        "D_opt": {"point": d_opt},
        "tokens_per_param": {"point": d_opt / n_opt},
        "loss": {"point": loss},
    }
    if boot is not None:
        alloc = allocation_with_interval(boot.samples, budget, params=law.params_)
        for key in ("N_opt", "D_opt", "tokens_per_param", "loss"):
            result[key] = {k: float(v) for k, v in alloc[key].items()}
        result["level"] = alloc["level"]
        result["n_valid_samples"] = alloc["n_valid"]
    result["extrapolation"] = extrapolation_warning(law.range_, C=budget, N=n_opt, D=d_opt)
    if requests is not None:
        rows = lifecycle_table(law.params_, list(requests), tokens_per_request, budget=budget)
        result["lifecycle"] = {"tokens_per_request": tokens_per_request, "rows": rows}
    result["fit"] = {k: fitted[k] for k in _FIT_KEYS}
    result["source"] = points.source
    return result
