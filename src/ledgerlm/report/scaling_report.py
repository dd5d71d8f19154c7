"""The scaling-law report: one self-contained HTML page over a fitted ``ScalingLaw``.

Three interactive plotly figures (drawn with ``plots.py``, like the run report: plotly.js
inlined once, nothing fetched; hover a point for its N, D, C and loss, drag to zoom),
the parameter table and the fit's numbers; every piece of text is escaped.

1. Loss against training compute C = 6ND (log x): the points, the fitted
   compute-optimal frontier L*(C) = ``optimal_loss(params, C)`` over the fitted range
   of C and ``extend_dex`` decades past each end, its ``level`` band from the bootstrap
   (per C, the central percentile range of L*(C) over the samples, a filled polygon),
   the fitted range's edges as vertical lines, and the extrapolated part dashed.
2. isoFLOP profiles (when an ``IsoFlopFit`` is given): loss against N (log x) per
   compute budget, each with its fitted parabola in log N and the parabola's minimum;
   the law's own compute-optimal point at each budget is drawn for comparison.
3. The fit's residuals log L - log L_hat (``law.residuals_``) against C (log x), with a
   zero line.

No point is dropped or re-fitted here: the page draws what the estimator returned.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ledgerlm.report.plots import axis, e, figure, figure_html, layout, page, run_color, t
from ledgerlm.scaling.allocate import allocation_with_interval, compute_optimal, optimal_loss
from ledgerlm.scaling.law import NAMES, flops

if TYPE_CHECKING:
    from ledgerlm.scaling.fit import Bootstrap, IsoFlopFit, ScalingLaw

DEFAULT_TITLE = "ledgerlm scaling-law fit"
EXTEND_DEX = 0.5  # the frontier runs this many decades of C past each end of the fit
LEVEL = 0.95
POINT_COLOR = "#1f77b4"
FRONTIER_COLOR = "#d62728"
BAND_COLOR = "rgba(214, 39, 40, 0.25)"
_INSIDE, _OUTSIDE = 81, 17  # frontier samples inside the fitted range and past each end

# Axis titles: a quantity and its unit (a count is its own unit).
COMPUTE = "training compute C = 6ND (FLOPs)"
LOSS = "loss (nat/token)"
PARAMETERS = "parameters N"
RESIDUAL = "log L - log L_hat (ln of loss ratio)"

_CSS = """
.note { color: #555; font-size: 12px; max-width: 900px; }
table.params td:nth-child(2) { text-align: right; }
"""


def _g(v: float, digits: int = 4) -> str:
    """``digits`` significant digits, exponents written 1.5e18 (not 1.5e+18)."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.{digits}g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _floats(values: Any) -> list[float | None]:
    """Plain JSON numbers (plotly would write numpy arrays as base64); NaN as gaps."""
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, float).ravel()]


def _points(N, D, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    N, D, loss = (np.asarray(v, dtype=np.float64).ravel() for v in (N, D, loss))
    if not N.size == D.size == loss.size:
        raise ValueError(f"N, D and loss differ in length: {N.size}, {D.size}, {loss.size}")
    for name, v in (("N", N), ("D", D), ("loss", loss)):
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"{name} must be finite and positive")
    return N, D, loss


def _point_title(n: float, d: float, c: float, loss: float) -> str:
    return f"N={_g(n, 3)}, D={_g(d, 3)}, C={_g(c, 3)}: loss {_g(loss)}"


def _points_trace(x, y, hover: list[str], name: str, color: str = POINT_COLOR) -> dict:
    return {
        "type": "scatter",
        "mode": "markers",
        "x": _floats(x),
        "y": _floats(y),
        "name": name,
        "marker": {"size": 6, "color": color, "opacity": 0.75},
        "hovertext": [t(h) for h in hover],
        "hovertemplate": "%{hovertext}<extra></extra>",
        "meta": {"role": "points"},
    }


def _edge(x: float, text: str, side: str) -> dict[str, Any]:
    """A vertical dashed line at ``x`` (data units, also on a log axis) over the plot,
    labelled at its top on its ``side`` (``left`` or ``right``)."""
    return {
        "type": "line",
        "xref": "x",
        "x0": x,
        "x1": x,
        "yref": "paper",
        "y0": 0,
        "y1": 1,
        "line": {"color": "#555", "width": 1, "dash": "dash"},
        "label": {
            "text": t(text),
            "textposition": "end",
            "textangle": 0,
            "xanchor": "left" if side == "right" else "right",
            "yanchor": "top",
            "padding": 4,
            "font": {"size": 10},
        },
    }


# ---------------------------------------------------------------------------- (1) frontier


def _frontier_grid(c_lo: float, c_hi: float, extend_dex: float):
    """C values for the frontier and the slices of it below, inside and above the fit."""
    u0, u1 = math.log10(c_lo), math.log10(c_hi)
    inside = np.logspace(u0, u1, _INSIDE)
    inside[0], inside[-1] = c_lo, c_hi
    if extend_dex <= 0:
        return inside, [(slice(0, _INSIDE), False)]
    below = np.logspace(u0 - extend_dex, u0, _OUTSIDE)
    above = np.logspace(u1, u1 + extend_dex, _OUTSIDE)
    grid = np.concatenate([below[:-1], inside, above[1:]])
    a, b = _OUTSIDE - 1, _OUTSIDE - 1 + _INSIDE
    # Adjacent slices share their edge point so the solid and dashed parts join.
    return grid, [(slice(0, a + 1), True), (slice(a, b), False), (slice(b - 1, len(grid)), True)]


def frontier_figure(
    N, D, loss, params, samples, level: float, extend_dex: float
) -> tuple[Any, list[str]]:
    """Figure (1) and the notes that go under it."""
    C = flops(N, D)
    c_lo, c_hi = float(C.min()), float(C.max())
    grid, parts = _frontier_grid(c_lo, c_hi, extend_dex)
    notes: list[str] = []
    try:
        L_star = optimal_loss(params, grid)
    except ValueError as exc:  # a fit with a non-positive term has no frontier
        L_star = None
        notes.append(f"No compute-optimal frontier: {exc}.")
    data: list[dict[str, Any]] = []
    if L_star is not None and samples is not None:
        try:
            iv = allocation_with_interval(samples, grid, level=level, params=params)
        except ValueError as exc:
            notes.append(f"No bootstrap band: {exc}.")
        else:
            lo, hi = iv["loss"]["lo"], iv["loss"]["hi"]
            if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
                n_valid, n_samples = iv["n_valid"], iv["n_samples"]
                failed = n_samples - n_valid
                data.append(
                    {  # upper edge left to right, then the lower edge back
                        "type": "scatter",
                        "mode": "lines",
                        "x": _floats(grid) + _floats(grid[::-1]),
                        "y": _floats(hi) + _floats(lo[::-1]),
                        "fill": "toself",
                        "fillcolor": BAND_COLOR,
                        "line": {"width": 0},
                        "hoverinfo": "skip",
                        "name": f"{100 * level:g}% band of L*(C), {n_valid} bootstrap fits"
                        + ("" if failed == 0 else f" ({failed} failed refits left out)"),
                        "meta": {"role": "band"},
                    }
                )
            else:
                notes.append("No bootstrap band: the samples give non-finite losses.")
    elif samples is None:
        notes.append("No bootstrap samples were given, so no band is drawn.")
    if L_star is not None:
        shown = set()  # one legend entry for the fitted part, one for the extrapolated
        for sl, extrapolated in parts:
            group = "extrapolated" if extrapolated else "fit"
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": _floats(grid[sl]),
                    "y": _floats(L_star[sl]),
                    "name": f"frontier L*(C), {'extrapolated' if extrapolated else 'fitted range'}",
                    "legendgroup": group,
                    "showlegend": group not in shown,
                    "line": {
                        "color": FRONTIER_COLOR,
                        "width": 2,
                        "dash": "dash" if extrapolated else "solid",
                    },
                    "hovertemplate": "C %{x:.3g} FLOPs<br>L*(C) %{y:.4g} nat/token<extra></extra>",
                    "meta": {"role": "frontier", "part": group},
                }
            )
            shown.add(group)
    data.append(
        _points_trace(C, loss, [_point_title(*p) for p in zip(N, D, C, loss, strict=True)], "runs")
    )
    shapes = [
        {**_edge(c, f"fitted C {edge} {_g(c, 3)}", side), "name": f"range-{edge}"}
        for edge, c, side in (("min", c_lo, "right"), ("max", c_hi, "left"))
    ]
    return figure(
        data,
        layout(axis(COMPUTE, log=True, exponentformat="power"), axis(LOSS), shapes=shapes),
    ), notes


# ---------------------------------------------------------------------------- (2) isoFLOP


def isoflop_figure(N, D, loss, params, isoflop: IsoFlopFit) -> tuple[Any, list[str]]:
    """Figure (2) and its notes: per isoFLOP profile its points, parabola and minimum
    (one legend entry); then the line through the minima used and the law's
    compute-optimal point at each budget."""
    members = [isoflop.members(p) for p in isoflop.profiles]
    notes = [f"{n} points left out, {why}: not drawn." for why, n in isoflop.dropped]
    data: list[dict[str, Any]] = []
    for i, (p, m, used) in enumerate(zip(isoflop.profiles, members, isoflop.used, strict=True)):
        color, group = run_color(i), f"isoflop-{i}"
        why = "" if used else "; not used in the power-law fit (no interior minimum)"
        label = (
            f"budget C={_g(p.C, 3)} (level {_g(p.level, 3)}): {int(m.sum())} points; parabola "
            f"minimum N_opt={_g(p.N_opt, 3)}, L_opt={_g(p.L_opt)}{why}"
        )
        meta = {"level": float(p.level), "used": bool(used)}
        points = _points_trace(
            N[m],
            loss[m],
            [
                _point_title(n, d, c, v)
                for n, d, c, v in zip(N[m], D[m], flops(N[m], D[m]), loss[m], strict=True)
            ],
            f"C≈{_g(p.C, 2)} (n={int(m.sum())}{'' if used else ', not used'})",
            color,
        )
        data.append({**points, "legendgroup": group, "meta": {**meta, "role": "isoflop-points"}})
        x_opt = math.log(p.N_opt) if math.isfinite(p.N_opt) and p.N_opt > 0 else math.nan
        if m.any() and math.isfinite(x_opt) and math.isfinite(p.L_opt):
            x = np.linspace(float(np.log(N[m].min())), float(np.log(N[m].max())), 41)
            # The profile's parabola in vertex form: L_opt + c2 (log N - log N_opt)^2.
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": _floats(np.exp(x)),
                    "y": _floats(p.L_opt + p.curvature * (x - x_opt) ** 2),
                    "name": "parabola",
                    "legendgroup": group,
                    "showlegend": False,
                    "line": {"color": color, "width": 1.8, "dash": "solid" if used else "dash"},
                    "hovertext": t(label),
                    "hovertemplate": "%{hovertext}<extra></extra>",
                    "meta": {**meta, "role": "parabola"},
                }
            )
        if p.interior and math.isfinite(p.N_opt) and math.isfinite(p.L_opt):
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "x": [float(p.N_opt)],
                    "y": [float(p.L_opt)],
                    "name": "minimum",
                    "legendgroup": group,
                    "showlegend": False,
                    "marker": {
                        "symbol": "diamond",
                        "size": 12,
                        "color": color,
                        "line": {"color": "#000", "width": 1},
                    },
                    "hovertext": [t(label)],
                    "hovertemplate": "%{hovertext}<extra></extra>",
                    "meta": {**meta, "role": "minimum"},
                }
            )
    minima = [
        (p.N_opt, p.L_opt)
        for p, used in zip(isoflop.profiles, isoflop.used, strict=True)
        if used and math.isfinite(p.N_opt) and math.isfinite(p.L_opt)
    ]
    if len(minima) > 1:
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": [float(n) for n, _ in minima],
                "y": [float(v) for _, v in minima],
                "name": "isoFLOP minima used in the power-law fit",
                "line": {"color": "#000", "width": 1, "dash": "dot"},
                "hoverinfo": "skip",
                "meta": {"role": "optima"},
            }
        )
    try:
        law_opt = [
            (p, float(compute_optimal(params, p.C)[0]), float(optimal_loss(params, p.C)))
            for p in isoflop.profiles
        ]
    except ValueError:
        law_opt = []
    if law_opt:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [n for _, n, _ in law_opt],
                "y": [v for _, _, v in law_opt],
                "name": "the law's compute-optimal N*, L*",
                "marker": {
                    "symbol": "x-thin-open",
                    "size": 10,
                    "color": "#000",
                    "line": {"width": 2, "color": "#000"},
                },
                "hovertext": [
                    t(f"fitted law at C={_g(p.C, 3)}: N*={_g(n, 3)}, L*={_g(v)}")
                    for p, n, v in law_opt
                ],
                "hovertemplate": "%{hovertext}<extra></extra>",
                "meta": {"role": "law-optimum"},
            }
        )
    return figure(data, layout(axis(PARAMETERS, log=True), axis(LOSS))), notes


# ---------------------------------------------------------------------------- (3) residuals


def residual_figure(N, D, loss, residuals) -> Any:
    C = flops(N, D)
    m = max(float(np.max(np.abs(residuals))), 1e-6) * 1.15
    hover = [
        _point_title(n, d, c, v) + f"; residual {r:+.4f}"
        for n, d, c, v, r in zip(N, D, C, loss, residuals, strict=True)
    ]
    zero = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": "y",
        "y0": 0,
        "y1": 0,
        "line": {"color": "#000", "width": 1.2},
        "name": "zero",
    }
    return figure(
        [_points_trace(C, residuals, hover, "runs")],
        layout(
            axis(COMPUTE, log=True, exponentformat="power"),
            axis(RESIDUAL, range=[-m, m], zeroline=False),
            shapes=[zero],
            showlegend=False,
        ),
    )


# ---------------------------------------------------------------------------- the page


def _params_table(params, samples, level: float) -> str:
    est = list(params.as_array())
    a_exp = params.beta / (params.alpha + params.beta)
    rows = [(name, v) for name, v in zip(NAMES, est, strict=True)]
    rows += [("a = beta/(alpha+beta): N* ∝ C^a", a_exp), ("b = 1 - a: D* ∝ C^b", 1 - a_exp)]
    intervals: list[tuple[float, float] | None] = [None] * len(rows)
    n_valid = 0
    if samples is not None:
        S = np.asarray(samples, dtype=np.float64)
        if S.ndim == 2 and S.shape[1] == 5:
            S = S[np.all(np.isfinite(S), axis=1) & np.all(S[:, 1:] > 0, axis=1)]
            n_valid = len(S)
        if n_valid:
            a_s = S[:, 4] / (S[:, 3] + S[:, 4])
            cols = np.column_stack([S, a_s, 1 - a_s])
            tail = 50.0 * (1.0 - level)
            lo, hi = np.percentile(cols, [tail, 100.0 - tail], axis=0)
            intervals = list(zip(lo, hi, strict=True))
    head = f"{100 * level:g}% bootstrap interval ({n_valid} fits)" if n_valid else "interval"
    body = "".join(
        f"<tr><td>{e(name)}</td><td>{e(_g(v))}</td>"
        f"<td>{'-' if iv is None else e(f'{_g(iv[0])} to {_g(iv[1])}')}</td></tr>"
        for (name, v), iv in zip(rows, intervals, strict=True)
    )
    return (
        f'<table class="params"><thead><tr><th>parameter</th><th>fit</th><th>{e(head)}</th>'
        f"</tr></thead><tbody>{body}</tbody></table>"
    )


def render_scaling_report(
    N,
    D,
    loss,
    law: ScalingLaw,
    boot: Bootstrap | np.ndarray | None = None,
    isoflop: IsoFlopFit | None = None,
    title: str = DEFAULT_TITLE,
    *,
    level: float = LEVEL,
    extend_dex: float = EXTEND_DEX,
) -> str:
    """The whole scaling-law report page, as HTML.

    ``N``, ``D``, ``loss``: the points ``law`` (a fitted ``ScalingLaw``) was fitted on,
    in the same order (its ``residuals_`` are drawn against them). ``boot``: a
    ``Bootstrap`` from ``law.bootstrap`` (or its (n, 5) ``samples``) for the band and the
    parameter intervals. ``isoflop``: an ``IsoFlopFit`` from ``isoflop_fit`` on the same
    points, in the same order (each profile draws the points it was fitted on).
    ``title`` is text (escaped). ``level``: the
    band's and the intervals' coverage; ``extend_dex``: how far past the fitted range of
    C the frontier is drawn (dashed), in decades.
    """
    N, D, loss = _points(N, D, loss)
    params = getattr(law, "params_", None)
    if params is None:
        raise ValueError("the law is not fitted: call ScalingLaw().fit(N, D, loss) first")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    residuals = np.asarray(law.residuals_, dtype=np.float64).ravel()
    if residuals.shape != N.shape or not np.allclose(
        np.log(loss) - np.log(params.predict(N, D)), residuals, rtol=0.0, atol=1e-6
    ):
        raise ValueError(
            f"the law's residuals ({residuals.size}) do not match these {N.size} points: "
            "pass the N, D and loss it was fitted on, in the same order"
        )
    samples = None if boot is None else np.asarray(getattr(boot, "samples", boot), dtype=float)
    C = flops(N, D)

    frontier, notes = frontier_figure(N, D, loss, params, samples, level, extend_dex)
    rmse = float(np.sqrt(np.mean(residuals**2)))
    intro = (
        f"<p>{N.size} runs, fitted as L(N, D) = E + A N<sup>-alpha</sup> + B D<sup>-beta</sup> "
        "(Huber loss on log loss). Fitted range: N from "
        f"{e(_g(N.min(), 3))} to {e(_g(N.max(), 3))}, D from {e(_g(D.min(), 3))} to "
        f"{e(_g(D.max(), 3))}, C = 6ND from {e(_g(C.min(), 3))} to {e(_g(C.max(), 3))} FLOPs. "
        f"RMS log residual {e(_g(rmse, 3))}.</p>{_params_table(params, samples, level)}"
    )
    sections = [
        "<h2>Loss against training compute, with the compute-optimal frontier</h2>"
        "<p>Each point is a run at its training compute C = 6ND. The red line is the "
        "loss the fitted law predicts at the compute-optimal split of each budget, "
        "L*(C); it is solid over the fitted range of C (between the grey dashed lines) "
        "and dashed where it extrapolates. The shaded band is the bootstrap's percentile "
        f"range of L*(C).</p>{figure_html('frontier', frontier)}"
        + "".join(f'<p class="note">{e(n)}</p>' for n in notes)
    ]
    if isoflop is not None:
        used = sum(isoflop.used)
        iso_fig, iso_notes = isoflop_figure(N, D, loss, params, isoflop)
        sections.append(
            "<h2>isoFLOP profiles</h2>"
            "<p>Loss against model size at each compute budget, with the parabola in log N "
            "fitted to each profile and its minimum (diamond); dashed profiles have no "
            "interior minimum and were not used. Crosses mark the fitted law's own "
            f"compute-optimal point at each budget. Power law over {used} of "
            f"{len(isoflop.profiles)} budgets: N_opt ∝ C<sup>{e(_g(isoflop.a, 3))}</sup>, "
            f"D_opt ∝ C<sup>{e(_g(isoflop.b, 3))}</sup> (the parametric fit gives "
            f"{e(_g(params.beta / (params.alpha + params.beta), 3))}).</p>"
            + figure_html("isoflop", iso_fig)
            + f'<p class="note">Grouping: {e(isoflop.rule)}.</p>'
            + "".join(f'<p class="note">{e(n)}</p>' for n in iso_notes)
        )
    else:
        sections.append('<h2>isoFLOP profiles</h2><p class="note">No isoFLOP fit was given.</p>')
    sections.append(
        "<h2>Residuals</h2>"
        "<p>log L - log L_hat for each run (above the line: the run did worse than the "
        f"law predicts).</p>{figure_html('residuals', residual_figure(N, D, loss, residuals))}"
    )
    body = f"<h1>{e(title)}</h1>{intro}{''.join(sections)}"
    return page(title, body, _CSS)
