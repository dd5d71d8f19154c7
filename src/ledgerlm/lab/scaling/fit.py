"""A scaling-law fit as an expert makes it, in order: an explicit outlier rule (the K
highest losses), held-out points split off (a rule such as ``C>=1e20``, or the K largest
budgets: ``ledgerlm.scaling.holdout``), replicates of one (N, D) reduced (``best`` /
``mean`` / ``none``), the fit with its cluster bootstrap, then optionally a residual rule
(points further than R in log loss dropped and the law refitted). Every point left out
is listed with its reason.

Options that cannot be honoured are an ``ArgumentError`` naming the ``FitOptions``
field; a fit that cannot be made is a ``ValueError`` naming the points' source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ledgerlm.errors import ArgumentError
from ledgerlm.lab.scaling.points import FitPoints

if TYPE_CHECKING:
    from ledgerlm.scaling.fit import Bootstrap, ScalingLaw
    from ledgerlm.scaling.replicates import Reduced

MIN_POINTS = 5  # five parameters: E, A, B, alpha, beta


@dataclass(frozen=True)
class FitOptions:
    """How points become a fit. ``reduce``: rows sharing (N, D): ``best`` (the lowest
    loss), ``mean`` or ``none``; None picks ``best`` when the points carry learning rates
    that differ within an (N, D), else ``none``. ``drop_top_loss``: leave out the K
    highest losses first. ``max_residual``: after a first fit, leave out points whose
    |log residual| exceeds it and refit. ``holdout`` / ``holdout_top``: held-out points
    (see ``scaling.holdout``), scored but not fitted. A ``reduce`` that is none of these or
    a ``max_residual`` that is not a positive number is refused when the options are
    made, before any point is read."""

    reduce: str | None = None
    drop_top_loss: int = 0
    max_residual: float | None = None
    holdout: str | None = None
    holdout_top: int = 0
    n_boot: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        from ledgerlm.scaling.replicates import REDUCTIONS

        if self.reduce is not None and self.reduce not in REDUCTIONS:
            raise ArgumentError(
                "{reduce}: expected one of {known}, got {given!r}",
                known=", ".join(REDUCTIONS),
                given=self.reduce,
            )
        r = self.max_residual
        if r is not None and not (math.isfinite(r) and r > 0):
            raise ArgumentError("{max_residual} must be a positive number")


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
    from ledgerlm.scaling.holdout import holdout_mask
    from ledgerlm.scaling.replicates import default_reduction, reduce_replicates

    options = options or FitOptions()
    dropped: list[dict[str, Any]] = []
    pool = points
    if options.drop_top_loss:
        k = options.drop_top_loss
        if k < 0 or k >= len(pool):
            raise ArgumentError(
                "{drop_top_loss} {k}: must be between 0 and {most}", k=k, most=len(pool) - 1
            )
        top = np.argsort(-pool.loss, kind="stable")[:k]
        dropped += pool.rows(top, f"one of the {k} highest losses (--drop-top-loss {k})")
        keep = np.ones(len(pool), dtype=bool)
        keep[top] = False
        pool = pool.select(keep)
    held = None
    if options.holdout or options.holdout_top:
        mask = holdout_mask(pool.N, pool.D, pool.loss, options.holdout, options.holdout_top)
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
