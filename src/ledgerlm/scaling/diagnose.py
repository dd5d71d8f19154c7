"""Is each fitted parameter identified by the points? (The fit converging says nothing.)

Per parameter of L = E + A N^-alpha + B D^-beta, from the fit and its bootstrap:

- **degenerate**: the points do not determine it.
  - A bootstrap interval with an end that is not finite (nan or inf: refits that
    diverged, as a loss of 1e300 among the points makes them): nothing is bounded.
  - E driven to ~0, or a bootstrap interval of E reaching ~0 (below ``E_FLOOR`` of
    the lowest observed loss): the irreducible loss is not identified, and A, B and the
    exponents absorb it.
  - An exponent whose bootstrap interval reaches 0 or below: the data do not show
    the loss falling with that axis.
  - An estimate on an edge of the box the optimizer searches (``fit.BOUNDS``: an
    exponent at 0 or at ``EXPONENT_MAX``, log A or log B at ``LOG_SCALE_MAX``): the
    objective kept falling towards the edge, so the points do not bound it.
- **weakly identified**: determined, but loosely.
  - The bootstrap interval's ends differ by more than ``SPAN`` times (10x for E, two
    orders of magnitude for the scale factors A and B) or by more than a factor
    ``EXPONENT_SPAN`` for an exponent.
  - The estimate of A, B, alpha or beta lies beyond the initialization grid (the
    grid did not bracket it: e.g. alpha above 2, or A above e^25).
- **identified**: none of these.

The fit's overall status is its worst parameter's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ledgerlm.scaling.law import NAMES, LawParams

E_FLOOR = 1e-3  # E below this share of the lowest observed loss: not identified
SPAN = {"E": 10.0, "A": 100.0, "B": 100.0}  # interval hi / lo above this: weakly identified
EXPONENT_SPAN = 3.0  # interval hi / lo of alpha or beta above this: weakly identified
EDGE = 1e-4  # an estimate this close to an edge of the search box (in theta) is on it
ORDER = ("identified", "weakly identified", "degenerate")

# where each parameter lives in the optimizer's theta (logs of E, A, B; exponents as is)
_THETA = {"A": ("a", np.log), "B": ("b", np.log)}


@dataclass(frozen=True)
class ParamCheck:
    name: str
    value: float
    status: str
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": self.value,
            "status": self.status,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class Diagnosis:
    params: tuple[ParamCheck, ...]
    status: str = field(init=False)

    def __post_init__(self) -> None:
        worst = max((ORDER.index(p.status) for p in self.params), default=0)
        object.__setattr__(self, "status", ORDER[worst])

    def problems(self) -> list[str]:
        """One line per parameter that is not identified."""
        return [
            f"{p.name} {p.status}: {'; '.join(p.reasons)}"
            for p in self.params
            if p.status != "identified"
        ]

    def to_dict(self) -> dict:
        return {"status": self.status, "params": [p.to_dict() for p in self.params]}


def _ratio(lo: float, hi: float) -> float:
    return hi / lo if lo > 0 else float("inf")


def _edge(name: str, value: float) -> str | None:
    """``value`` on an edge of the optimizer's box (``fit.BOUNDS``) in theta terms, e.g.
    "alpha = 5, the highest searched"; None when it is inside (E's e is unbounded)."""
    from ledgerlm.scaling.fit import BOUNDS

    key, to_theta = _THETA.get(name, (name, float))
    if name == "E" or not np.isfinite(value) or (key != name and not value > 0):
        return None
    t = float(to_theta(value))
    lo, hi = BOUNDS[NAMES.index(name)]  # theta's order is NAMES's
    for end, side in ((lo, "lowest"), (hi, "highest")):
        if end is not None and abs(t - end) <= EDGE * max(1.0, abs(end)):
            return f"{key} = {end:g}, the {side} searched"
    return None


def diagnose(
    params: LawParams,
    min_loss: float,
    intervals: Mapping[str, tuple[float, float]] | None = None,
    grid: Mapping[str, np.ndarray] | None = None,
) -> Diagnosis:
    """Each parameter's status with its reasons. ``intervals``: the bootstrap intervals
    by name (without them, only E ~ 0 and the grid edges are judged); ``grid``: the
    initialization axes (keys e, a, b, alpha, beta; default Hoffmann's)."""
    from ledgerlm.scaling.fit import HOFFMANN_GRID

    grid = HOFFMANN_GRID if grid is None else grid
    values = dict(zip(NAMES, params.as_array(), strict=True))
    checks = []
    for name in NAMES:
        value = float(values[name])
        degenerate, weak = [], []
        edge = _edge(name, value)
        if edge:
            degenerate.append(f"the fit ran to the edge of the searched box ({edge})")
        if name == "E" and value < E_FLOOR * min_loss:
            degenerate.append(
                f"E = {value:.3g} is ~0 (below {E_FLOOR:g} x the lowest loss "
                f"{min_loss:.3g}): the irreducible loss is not identified"
            )
        if intervals and name in intervals:
            lo, hi = intervals[name]
            if not (np.isfinite(lo) and np.isfinite(hi)):
                degenerate.append(
                    f"its interval [{lo:.3g}, {hi:.3g}] is not finite: bootstrap refits diverged"
                )
            elif not edge and _edge(name, hi):  # the one lower edge, 0, is judged below
                degenerate.append(
                    f"its interval [{lo:.3g}, {hi:.3g}] reaches the edge of the searched box "
                    f"({_edge(name, hi)}): bootstrap refits ran off"
                )
            elif name == "E" and not degenerate and lo < E_FLOOR * min_loss:
                degenerate.append(
                    f"its interval [{lo:.3g}, {hi:.3g}] reaches ~0: the irreducible loss "
                    "is not identified"
                )
            elif name in ("alpha", "beta"):
                if lo <= 0:
                    degenerate.append(f"its interval [{lo:.3g}, {hi:.3g}] reaches 0")
                elif _ratio(lo, hi) > EXPONENT_SPAN:
                    weak.append(f"its interval [{lo:.3g}, {hi:.3g}] spans {_ratio(lo, hi):.3g}x")
            elif _ratio(lo, hi) > SPAN[name]:
                weak.append(
                    f"its interval [{lo:.3g}, {hi:.3g}] spans {_ratio(lo, hi):.3g}x "
                    f"(more than {SPAN[name]:g}x)"
                )
        if name != "E":  # E's own check is the one above: its grid spans only 0.37-2.7
            key, to_theta = _THETA.get(name, (name, float))
            axis = np.asarray(grid[key], dtype=np.float64)
            t = float(to_theta(value)) if value > 0 or key == name else float("-inf")
            if t < axis.min() or t > axis.max():
                side = "below" if t < axis.min() else "above"
                weak.append(
                    f"the estimate lies {side} the search grid ({key} in "
                    f"[{axis.min():g}, {axis.max():g}], got {t:.3g})"
                )
        status = "degenerate" if degenerate else "weakly identified" if weak else "identified"
        checks.append(ParamCheck(name, value, status, tuple(degenerate + weak)))
    return Diagnosis(tuple(checks))
