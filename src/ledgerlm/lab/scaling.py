"""Scaling-law fits of the lab's runs (SPEC S2-S4), as ``ledgerlm scale fit`` and
``ledgerlm scale recommend`` compute them; the CLI only parses arguments and prints.

- ``load_points``: the (N, D, loss) points of a sweep, a list of runs (read back from the
  ledger by ``ledgerlm.lab.sweep.sweep_points``) or a CSV table (``scaling.table``: its
  own column names, or named ones), with where each came from and its learning rate.
- ``fit``: what an expert does around the estimator, in order: an explicit outlier rule
  (the K highest losses), held-out points split off (a rule such as ``C>=1e20``, or
  the K largest budgets), replicates of one (N, D) reduced (``best`` / ``mean`` /
  ``none``), the fit with its cluster bootstrap, then optionally a residual rule (points
  further than R in log loss dropped and the law refitted). Every point left out is
  listed with its reason.
- ``fit_summary``: the fit as a JSON-able dict: parameters and intervals, diagnostics
  (identified, weakly identified, degenerate, with reasons), held-out errors (MAE, RMSE,
  signed bias, largest relative error), isoFLOP grouping, warnings.
- ``write_fit_report``: the fit as a self-contained HTML page, written atomically.
- ``recommend``: the compute-optimal N* and D* for a budget, and the lifecycle table
  for future requests, every row with its bootstrap interval and extrapolation flag
  (N, D, C and tokens per parameter).

The estimator and the allocation maths are ``ledgerlm.scaling``; the page is
``ledgerlm.report.scaling_report``. Those (and scipy with them) are imported only when a
fit, a recommendation or a page is made.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ledgerlm.workspace import DEFAULT_WORKSPACE, Workspace, atomic_write_text

if TYPE_CHECKING:
    from ledgerlm.scaling.fit import Bootstrap, ScalingLaw
    from ledgerlm.scaling.replicates import Reduced

MIN_POINTS = 5  # five parameters: E, A, B, alpha, beta
LAW = "L(N, D) = E + A N^-alpha + B D^-beta (Huber on log loss)"
PARAMS = ("forward", "total")  # what N counts: see load_points
_FIT_KEYS = (
    "params",
    "intervals",
    "residual_rms_log",
    "range",
    "n_distinct",
    "warnings",
    "diagnostics",
)


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

    ``source`` is ``{"sweep": id}``, ``{"runs": [refs]}`` or ``{"csv": path}``; ``labels``
    names each point (its run id, or ``line K`` of the CSV); ``runs`` one row (run, N, D,
    loss) per point read from the ledger (none from a CSV); ``skipped`` the ``[run id,
    reason]`` of the runs with no final point; ``lr`` each point's learning rate when
    known; ``budget`` each point's isoFLOP budget label when the table has one;
    ``missing`` a sweep's planned points without a result (``planned``, ``points``,
    ``line``: ``lab.sweep.missing_line``), None when none is missing or nothing was planned.
    """

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    source: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[list[str]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    lr: np.ndarray | None = None
    budget: np.ndarray | None = None
    columns: dict[str, str] = field(default_factory=dict)
    missing: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [f"point {i + 1}" for i in range(len(self.N))]

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def __len__(self) -> int:
        return len(self.N)

    def distinct(self) -> int:
        """How many distinct (N, D) pairs there are (repeated seeds count once)."""
        from ledgerlm.scaling.replicates import group_ids

        return int(group_ids(self.N, self.D).max()) + 1 if len(self.N) else 0

    def describe(self) -> str:
        """Where the points came from, in words (see ``describe_source``)."""
        return describe_source(self.source)

    def select(self, keep: np.ndarray) -> FitPoints:
        """The points where ``keep`` (a boolean mask or indices) holds, in that order."""
        idx = np.arange(len(self.N))[keep]
        pick = lambda a: None if a is None else a[idx]  # noqa: E731
        return FitPoints(
            self.N[idx],
            self.D[idx],
            self.loss[idx],
            self.source,
            [self.runs[i] for i in idx] if self.runs else [],
            self.skipped,
            [self.labels[i] for i in idx],
            pick(self.lr),
            pick(self.budget),
            self.columns,
            self.missing,
        )

    def rows(self, idx: Sequence[int], why: str) -> list[dict[str, Any]]:
        """The points at ``idx`` as rows naming why they were left out."""
        return [
            {
                "point": self.labels[i],
                "N": float(self.N[i]),
                "D": float(self.D[i]),
                "loss": float(self.loss[i]),
                "why": why,
            }
            for i in idx
        ]


def load_points(
    sweep: str | None = None,
    runs: str | Sequence[str] | None = None,
    csv: str | Path | None = None,
    *,
    workspace: Workspace | str | Path = DEFAULT_WORKSPACE,
    columns: Mapping[str, str | None] | None = None,
    params: str = "forward",
) -> FitPoints:
    """(N, D, loss) from exactly one source: a sweep (id, unique prefix or ``latest``),
    runs (ids or unique prefixes; a string is split on commas) or a CSV table.

    Sweeps and runs are read from the workspace's ledger: N as the sweep plan counts it
    (``params="forward"``: the weights the forward pass multiplies by, the N of C = 6ND)
    or every parameter with the token embedding (``"total"``), D the tokens each run
    consumed, loss its final validation loss. A CSV's columns are found by name or named
    in ``columns`` (keys n_col, d_col, c_col, loss_col, lr_col, budget_col)."""
    if sum(1 for v in (sweep, runs, csv) if v) != 1:
        raise ValueError("give exactly one source of points: a sweep, runs or a CSV file")
    if params not in PARAMS:
        raise ValueError(f"params must be one of {', '.join(PARAMS)}, got {params!r}")
    if csv is not None:
        return _csv_points(Path(csv), dict(columns or {}))

    from ledgerlm.lab.sweep import sweep_points
    from ledgerlm.ledger.store import Ledger, require_ledger

    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    require_ledger(ws.ledger_path, "run a sweep first", FileNotFoundError)
    with Ledger(ws.ledger_path) as ledger:
        if sweep:
            found = sweep_points(ledger, sweep, ws)
            source: dict[str, Any] = {"sweep": found.sweep_id}
        else:
            items = runs.split(",") if isinstance(runs, str) else runs
            refs = [r.strip() for r in items if r.strip()]
            found = sweep_points(ledger, refs, ws)
            source = {"runs": refs}
    N = found.N_total if params == "total" else found.N
    columns = {
        "N": "every parameter" if params == "total" else "forward parameters (C = 6ND)",
        "D": "tokens consumed",
        "loss": "final validation loss",
    }
    rows = found.rows()
    line = found.missing_line()
    missing = None
    if line is not None:
        missing = {"planned": found.planned, "points": found.missing, "line": line}
    if params == "total":
        rows = [{**r, "N": int(n)} for r, n in zip(rows, N, strict=True)]
    return FitPoints(
        np.asarray(N, dtype=np.float64),
        np.asarray(found.D, dtype=np.float64),
        np.asarray(found.loss, dtype=np.float64),
        source,
        rows,
        [list(s) for s in found.skipped],
        list(found.runs),
        found.lr,
        columns=columns,
        missing=missing,
    )


def _csv_points(path: Path, columns: dict[str, str | None]) -> FitPoints:
    from ledgerlm.scaling.table import read_points

    table = read_points(path, **{k: v for k, v in columns.items() if v is not None})
    return FitPoints(
        table.N,
        table.D,
        table.loss,
        {"csv": str(path)},
        labels=[f"line {n}" for n in table.lines],
        lr=table.lr,
        budget=table.budget,
        columns=table.columns,
    )


# -- held-out rules -------------------------------------------------------------------

_RULE = re.compile(r"^\s*(N|D|C|D/N|loss)\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def holdout_mask(points: FitPoints, rule: str | None = None, top: int = 0) -> np.ndarray:
    """The points to hold out: those matching ``rule`` (``C>=1e20``: N, D, C = 6ND, D/N or
    loss against a number) and/or the ``top`` (N, D) points of largest compute (with all
    their replicates)."""
    from ledgerlm.scaling.law import flops

    held = np.zeros(len(points), dtype=bool)
    if rule:
        m = _RULE.match(rule)
        if m is None:
            raise ValueError(
                f"--holdout {rule!r}: expected QUANTITY OP NUMBER, e.g. C>=1e20 "
                "(quantities N, D, C, D/N, loss; operators >=, <=, >, <)"
            )
        key, op, text = m.groups()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--holdout {rule!r}: {text!r} is not a number") from None
        quantity = {
            "N": points.N,
            "D": points.D,
            "C": flops(points.N, points.D),
            "D/N": points.D / points.N,
            "loss": points.loss,
        }[key]
        held |= _OPS[op](quantity, value)
    if top:  # the top (N, D) pairs, with every row (replicate) of each
        from ledgerlm.scaling.replicates import group_ids

        groups = group_ids(points.N, points.D)
        compute = np.zeros(int(groups.max()) + 1)
        compute[groups] = flops(points.N, points.D)
        largest = np.argsort(-compute, kind="stable")[:top]
        held |= np.isin(groups, largest)
    return held


# -- the fit --------------------------------------------------------------------------


@dataclass(frozen=True)
class FitOptions:
    """How points become a fit. ``reduce``: rows sharing (N, D): ``best`` (the lowest
    loss), ``mean`` or ``none``; None picks ``best`` when the points carry learning rates
    that differ within an (N, D), else ``none``. ``drop_top_loss``: leave out the K
    highest losses first. ``max_residual``: after a first fit, leave out points whose
    |log residual| exceeds it and refit. ``holdout`` / ``holdout_top``: held-out points
    (see ``holdout_mask``), scored but not fitted."""

    reduce: str | None = None
    drop_top_loss: int = 0
    max_residual: float | None = None
    holdout: str | None = None
    holdout_top: int = 0
    n_boot: int = 200
    seed: int = 0


@dataclass
class Fit:
    """A fitted law and everything that was done to the points to get it."""

    points: FitPoints  # as loaded
    used: FitPoints  # what the law was fitted on
    held: FitPoints | None
    law: ScalingLaw
    boot: Bootstrap | None
    reduction: Reduced
    dropped: list[dict[str, Any]]
    options: FitOptions

    def describe(self) -> str:
        return self.points.describe()


def _tuned(points: FitPoints) -> bool:
    """Whether the points carry learning rates that differ within one (N, D)."""
    if points.lr is None:
        return False
    from ledgerlm.scaling.replicates import group_ids

    groups = group_ids(points.N, points.D)
    if not groups.size:
        return False
    # more distinct (N, D, lr) than (N, D): some (N, D) has several learning rates
    return int(group_ids(groups, points.lr).max()) > int(groups.max())


def fit(points: FitPoints, options: FitOptions | None = None) -> Fit:
    """The law fitted on ``points`` as ``options`` say (see ``FitOptions`` and the module).

    Raises ``ValueError`` (one line naming the source) for fewer than ``MIN_POINTS``
    distinct (N, D) points, a fit that fails, or non-finite parameters."""
    from ledgerlm.scaling.replicates import default_reduction, reduce_replicates

    options = options or FitOptions()
    dropped: list[dict[str, Any]] = []
    pool = points
    if options.drop_top_loss:
        k = options.drop_top_loss
        if k < 0 or k >= len(pool):
            raise ValueError(f"--drop-top-loss {k}: must be between 0 and {len(pool) - 1}")
        top = np.argsort(-pool.loss, kind="stable")[:k]
        dropped += pool.rows(top, f"one of the {k} highest losses (--drop-top-loss {k})")
        keep = np.ones(len(pool), dtype=bool)
        keep[top] = False
        pool = pool.select(keep)
    held = None
    if options.holdout or options.holdout_top:
        mask = holdout_mask(pool, options.holdout, options.holdout_top)
        if not mask.any():
            raise ValueError(f"{points.describe()}: the held-out rule selects no point")
        held, pool = pool.select(mask), pool.select(~mask)
    how = options.reduce or default_reduction(_tuned(pool) or (held is not None and _tuned(held)))
    reduction = reduce_replicates(pool.N, pool.D, pool.loss, how)
    if held is not None and how != "none":  # held-out points are reduced the same way
        kept = reduce_replicates(held.N, held.D, held.loss, how)
        loss, held = kept.loss, held.select(kept.kept)
        held.loss = loss
    used = pool.select(reduction.kept)
    used.loss = reduction.loss
    if how != "none":
        left = np.setdiff1d(np.arange(len(pool)), reduction.kept)
        why = "a replicate of its (N, D) with a higher loss" if how == "best" else None
        if why:
            dropped += pool.rows(left, why)
    law, boot = _fit_law(used, options)
    if options.max_residual is not None:
        far = np.flatnonzero(np.abs(law.residuals_) > options.max_residual)
        if far.size:
            dropped += used.rows(
                far, f"|log residual| above {options.max_residual:g} (--max-residual)"
            )
            keep = np.ones(len(used), dtype=bool)
            keep[far] = False
            used = used.select(keep)
            law, boot = _fit_law(used, options)
    return Fit(points, used, held, law, boot, reduction, dropped, options)


def _fit_law(points: FitPoints, options: FitOptions) -> tuple[ScalingLaw, Bootstrap | None]:
    from ledgerlm.scaling.fit import ScalingLaw

    distinct = points.distinct()
    where = points.describe()
    left = f" ({len(points.skipped)} runs without a final loss left out)" if points.skipped else ""
    if points.missing:  # the planned points without a result say more
        left = f"; {points.missing['line']}"
    if distinct < MIN_POINTS:
        raise ValueError(
            f"{where}: the fit of E, A, B, alpha, beta needs at least {MIN_POINTS} points with "
            f"distinct (N, D), got {distinct}{left}"
        )
    try:
        law = ScalingLaw().fit(points.N, points.D, points.loss)
        boot = law.bootstrap(n=options.n_boot, seed=options.seed) if options.n_boot else None
    except (RuntimeError, FloatingPointError, ValueError) as exc:
        raise ValueError(f"{where}: the fit failed: {exc}") from None
    values = law.params_.as_array()
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{where}: the fit failed (non-finite parameters)")
    return law, boot


def _held_out(result: Fit) -> dict[str, Any] | None:
    if result.held is None:
        return None
    held = result.held
    out = result.law.evaluate_held_out(held.N, held.D, held.loss)
    rule = " and ".join(
        x
        for x in (
            result.options.holdout,
            f"the {result.options.holdout_top} largest C" if result.options.holdout_top else "",
        )
        if x
    )
    return {
        "rule": rule,
        **out.to_dict(),
        "points": [
            {
                "point": label,
                "N": float(n),
                "D": float(d),
                "loss": float(obs),
                "predicted": float(pred),
                "error": float(pred - obs),
                "relative_error": float(abs(pred - obs) / obs),
                "extrapolated": bool(x),
            }
            for label, n, d, obs, pred, x in zip(
                held.labels,
                held.N,
                held.D,
                out.observed,
                out.predicted,
                out.extrapolated,
                strict=True,
            )
        ],
    }


def _isoflop(result: Fit) -> dict[str, Any]:
    from ledgerlm.scaling.fit import isoflop_fit

    used = result.used
    try:
        iso = isoflop_fit(used.N, used.D, used.loss, used.budget)
    except ValueError as exc:
        return {"fitted": False, "why": str(exc)}
    return {
        "fitted": True,
        "a": iso.a,
        "b": iso.b,
        "budgets": len(iso.profiles),
        "used": int(sum(iso.used)),
        "grouped": iso.grouped,
        "dropped": [{"why": why, "points": n} for why, n in iso.dropped],
        "rule": iso.rule,
        "warnings": iso.warnings,
    }


def fit_summary(result: Fit, level: float = 0.95) -> dict[str, Any]:
    """The fit as a JSON-able dict: source, point counts, what was reduced and left out,
    warnings, parameters with their bootstrap intervals at ``level`` and their
    diagnostics, log residuals, fitted range, held-out errors, isoFLOP grouping, runs,
    skipped runs, and a sweep's planned points without a result."""
    from ledgerlm.scaling.diagnose import diagnose

    law, boot, used = result.law, result.boot, result.used
    intervals = boot.intervals(level) if boot is not None else {}
    r = np.asarray(law.residuals_, dtype=np.float64)
    distinct = used.distinct()
    diagnosis = diagnose(law.params_, float(used.loss.min()), intervals or None)
    warnings = [result.points.missing["line"]] if result.points.missing else []
    warnings += result.reduction.warnings()
    if distinct < 2 * MIN_POINTS:
        warnings.append(
            f"{distinct} distinct points for 5 parameters: the fit is barely determined, "
            "read its parameters and intervals with care"
        )
    warnings += [f"fit {p}" for p in diagnosis.problems()]
    isoflop = _isoflop(result)
    warnings += isoflop.get("warnings", [])
    return {
        "source": result.points.source,
        "columns": result.points.columns,
        "n_points": len(used),
        "n_loaded": len(result.points),
        "n_distinct": distinct,
        "reduction": result.reduction.to_dict(),
        "dropped": result.dropped,
        "warnings": warnings,
        "law": LAW,
        "params": law.params_.to_dict(),
        "level": level,
        "bootstrap": 0 if boot is None else len(boot.samples),
        "bootstrap_unit": "(N, D) group",
        "intervals": {k: list(v) for k, v in intervals.items()},
        "diagnostics": diagnosis.to_dict(),
        "residual_rms_log": float(np.sqrt(np.mean(r * r))),
        "residual_max_abs_log": float(np.max(np.abs(r))),
        "residuals_log": r.tolist(),
        "range": {k: list(v) for k, v in law.range_.items()},
        "held_out": _held_out(result),
        "isoflop": isoflop,
        "runs": used.runs,
        "skipped": result.points.skipped,
        "missing": result.points.missing,
    }


def write_fit_report(path: str | Path, result: Fit) -> None:
    """The fit as a self-contained HTML page at ``path``, written atomically: loss against
    compute with the fitted frontier and its bootstrap band, isoFLOP curves when budgets
    repeat (the page says so when none does), residuals."""
    from ledgerlm.report.scaling_report import render_scaling_report
    from ledgerlm.scaling.fit import isoflop_fit

    path = Path(path)
    N, D, loss = result.used
    try:
        iso = isoflop_fit(N, D, loss, result.used.budget)
    except ValueError:  # no budget with enough points: the page says so
        iso = None
    title = f"ledgerlm scaling fit: {result.describe()}"
    page = render_scaling_report(N, D, loss, result.law, boot=result.boot, isoflop=iso, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, page)


def recommend(
    result: Fit,
    budget: float,
    requests: Sequence[float] | None = None,
    tokens_per_request: float = 1000.0,
    inference_kappa: float | None = None,
) -> dict[str, Any]:
    """The compute-optimal allocation of a budget C (FLOPs, C = 6 N D) under the fitted
    law, as a JSON-able dict.

    ``N_opt``, ``D_opt``, ``tokens_per_param`` and the predicted ``loss``: each a
    ``point``, with ``lo``/``hi`` carried through the bootstrap when there is one (then
    also ``level`` and ``n_valid_samples``); ``extrapolation``: a warning when the
    budget or the optimum lies outside the fitted range of N, D, C or D/N, else None.
    With ``requests`` (future inference requests R, each of ``tokens_per_request``
    tokens at ``inference_kappa`` N FLOPs a token: 2 by default, or the measured or
    stated serving cost), ``lifecycle``: one row per R of the (N, D) minimising loss when
    training and serving share the budget, each with its bootstrap interval and its
    extrapolation flag. Then ``fit`` (the summary's parameters, intervals, residual RMS,
    range, distinct points, warnings and diagnostics) and ``source``.
    """
    from ledgerlm.scaling.allocate import (
        INFERENCE_KAPPA,
        allocation_with_interval,
        compute_optimal,
        extrapolation_warning,
        lifecycle_intervals,
        lifecycle_table,
    )

    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"budget {budget!r} is not a positive number of FLOPs")
    if not (math.isfinite(tokens_per_request) and tokens_per_request > 0):
        raise ValueError(f"tokens per request {tokens_per_request!r} is not a positive number")
    kappa_inf = INFERENCE_KAPPA if inference_kappa is None else float(inference_kappa)
    if not (math.isfinite(kappa_inf) and kappa_inf > 0):
        raise ValueError(f"serving FLOPs per parameter per token {kappa_inf!r} is not positive")
    law, boot = result.law, result.boot
    fitted = fit_summary(result)
    n_opt, d_opt = (float(x) for x in compute_optimal(law.params_, budget))
    loss = float(law.params_.predict(n_opt, d_opt))
    out: dict[str, Any] = {
        "budget": budget,
        "N_opt": {"point": n_opt},
        "D_opt": {"point": d_opt},
        "tokens_per_param": {"point": d_opt / n_opt},
        "loss": {"point": loss},
    }
    if boot is not None:
        alloc = allocation_with_interval(boot.samples, budget, params=law.params_)
        for key in ("N_opt", "D_opt", "tokens_per_param", "loss"):
            out[key] = {k: float(v) for k, v in alloc[key].items()}
        out["level"] = alloc["level"]
        out["n_valid_samples"] = alloc["n_valid"]
    out["extrapolation"] = extrapolation_warning(law.range_, C=budget, N=n_opt, D=d_opt)
    if requests is not None:
        kwargs = {"budget": budget, "inference_kappa": kappa_inf}
        rows = lifecycle_table(law.params_, list(requests), tokens_per_request, **kwargs)
        bands = (
            lifecycle_intervals(boot.samples, rows, tokens_per_request, **kwargs)
            if boot is not None
            else [None] * len(rows)
        )
        for row, band in zip(rows, bands, strict=True):
            trains = row["D"] >= 1
            row["extrapolation"] = (
                extrapolation_warning(law.range_, C=row["C_train"], N=row["N"], D=row["D"])
                if trains
                else None
            )
            row["interval"] = band
        out["lifecycle"] = {
            "tokens_per_request": tokens_per_request,
            "inference_kappa": kappa_inf,
            "rows": rows,
        }
    out["fit"] = {k: fitted[k] for k in _FIT_KEYS}
    out["source"] = result.points.source
    return out
