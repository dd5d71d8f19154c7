"""A fit as a JSON-able dict (``fit_summary``): parameters and intervals, diagnostics
(identified, weakly identified, degenerate, with reasons), held-out errors (MAE, RMSE,
signed bias, largest relative error), isoFLOP grouping, warnings."""

from __future__ import annotations

from typing import Any

import numpy as np

from ledgerlm.lab.scaling.fit import MIN_POINTS, Fit

LAW = "L(N, D) = E + A N^-alpha + B D^-beta (Huber on log loss)"


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
