"""The scaling-law report: one self-contained HTML page over a fitted ``ScalingLaw``.

Three charts, inline SVG drawn with the primitives the run report uses (``charts.py``),
no scripts and no external resources; every piece of text passes through ``html.escape``.

1. Loss against training compute C = 6ND (log x): the points, the fitted
   compute-optimal frontier L*(C) = ``optimal_loss(params, C)`` over the fitted range
   of C and ``extend_dex`` decades past each end, its ``level`` band from the bootstrap
   (per C, the central percentile range of L*(C) over the samples, a shaded polygon),
   the fitted range's edges as vertical lines, and the extrapolated part dashed.
2. isoFLOP profiles (when an ``IsoFlopFit`` is given): loss against N (log x) per
   compute budget, each with its fitted parabola in log N and the parabola's minimum;
   the law's own compute-optimal point at each budget is drawn for comparison.
3. The fit's residuals log L - log L_hat (``law.residuals_``) against C, with a zero line.

No point is dropped or re-fitted here: the page draws what the estimator returned.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ledgerlm.report.charts import (
    BOTTOM,
    LEFT,
    RIGHT,
    TOP,
    H,
    Scale,
    W,
    axes,
    chart_svg,
    e,
    page,
    run_color,
)
from ledgerlm.scaling.allocate import allocation_with_interval, compute_optimal, optimal_loss
from ledgerlm.scaling.law import NAMES, flops

if TYPE_CHECKING:
    from ledgerlm.scaling.fit import Bootstrap, IsoFlopFit, ScalingLaw

DEFAULT_TITLE = "ledgerlm scaling-law fit"
EXTEND_DEX = 0.5  # the frontier runs this many decades of C past each end of the fit
LEVEL = 0.95
POINT_COLOR = "#1f77b4"
FRONTIER_COLOR = "#d62728"
_INSIDE, _OUTSIDE = 81, 17  # frontier samples inside the fitted range and past each end

_CSS = """
.line { display: inline-block; width: 22px; height: 0; vertical-align: middle;
  margin-right: 5px; border-top: 2px solid #000; }
.dot { display: inline-block; width: 7px; height: 7px; border-radius: 50%;
  margin-right: 5px; }
.note { color: #555; font-size: 12px; max-width: 900px; }
table.params td:nth-child(2) { text-align: right; }
"""


def _g(v: float, digits: int = 4) -> str:
    """``digits`` significant digits, exponents written 1.5e18 (not 1.5e+18)."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:.{digits}g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _coords(xs: Scale, ys: Scale, X, Y) -> str:
    return " ".join(f"{xs(x):.1f},{ys(y):.1f}" for x, y in zip(X, Y, strict=True))


def _y_scale(values, pad_share: float = 0.06) -> Scale:
    v = np.asarray([x for x in values if math.isfinite(x)] or [0.0, 1.0])
    lo, hi = float(v.min()), float(v.max())
    pad = (hi - lo) * pad_share or 0.5
    return Scale(lo - pad, hi + pad, H - BOTTOM, TOP)


def _legend(items: list[tuple[str, str]]) -> str:
    """``items``: (HTML of the key mark, label text to escape)."""
    keys = " ".join(f'<span class="key">{mark}{e(label)}</span>' for mark, label in items)
    return f'<p class="legend">{keys}</p>'


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


def frontier_chart(
    N, D, loss, params, samples, level: float, extend_dex: float
) -> tuple[str, list[str]]:
    """Chart (1) and the notes that go under it."""
    C = flops(N, D)
    c_lo, c_hi = float(C.min()), float(C.max())
    grid, parts = _frontier_grid(c_lo, c_hi, extend_dex)
    notes: list[str] = []
    try:
        L_star = optimal_loss(params, grid)
    except ValueError as exc:  # a fit with a non-positive term has no frontier
        L_star = None
        notes.append(f"No compute-optimal frontier: {exc}.")
    band = None
    if L_star is not None and samples is not None:
        try:
            iv = allocation_with_interval(samples, grid, level=level, params=params)
        except ValueError as exc:
            notes.append(f"No bootstrap band: {exc}.")
        else:
            lo, hi = iv["loss"]["lo"], iv["loss"]["hi"]
            if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
                band = (lo, hi, iv["n_valid"], iv["n_samples"])
            else:
                notes.append("No bootstrap band: the samples give non-finite losses.")
    elif samples is None:
        notes.append("No bootstrap samples were given, so no band is drawn.")

    ys_all = list(loss)
    if L_star is not None:
        ys_all += list(L_star)
    if band is not None:
        ys_all += list(band[0]) + list(band[1])
    xs = Scale(float(min(grid[0], c_lo)), float(max(grid[-1], c_hi)), LEFT, W - RIGHT, log=True)
    ys = _y_scale(ys_all)
    body = axes(xs, ys, "training compute C = 6ND (FLOPs, log scale)", "loss (nat/token)")
    if band is not None:
        lo, hi, n_valid, n_samples = band
        upper = [f"{xs(c):.1f},{ys(v):.1f}" for c, v in zip(grid, hi, strict=True)]
        lower = [f"{xs(c):.1f},{ys(v):.1f}" for c, v in zip(grid[::-1], lo[::-1], strict=True)]
        label = f"{100 * level:g}% band of L*(C) over {n_valid} bootstrap fits" + (
            "" if n_valid == n_samples else f" ({n_samples - n_valid} failed refits left out)"
        )
        body.append(
            f'<polygon class="band" points="{" ".join(upper + lower)}" fill="{FRONTIER_COLOR}" '
            f'fill-opacity="0.25" stroke="none"><title>{e(label)}</title></polygon>'
        )
    for edge, c, anchor, dx in (("min", c_lo, "start", 4), ("max", c_hi, "end", -4)):
        x = xs(c)
        body.append(
            f'<g class="range-edge" data-edge="{edge}"><line x1="{x:.1f}" y1="{TOP}" '
            f'x2="{x:.1f}" y2="{H - BOTTOM}" stroke="#555" stroke-dasharray="3 3"/>'
            f'<text x="{x + dx:.1f}" y="{TOP + 12}" text-anchor="{anchor}">fitted C {edge} '
            f"{e(_g(c, 3))}</text><title>{e(f'{edge} of the fitted range: C = {_g(c)}')}</title>"
            "</g>"
        )
    if L_star is not None:
        lines = []
        for sl, extrapolated in parts:
            cls, dash = ("extrapolated", ' stroke-dasharray="6 4"') if extrapolated else ("fit", "")
            lines.append(
                f'<polyline class="{cls}" points="{_coords(xs, ys, grid[sl], L_star[sl])}" '
                f'fill="none" stroke="{FRONTIER_COLOR}" stroke-width="2"{dash}/>'
            )
        body.append(
            '<g class="frontier"><title>compute-optimal frontier L*(C) of the fitted law'
            "</title>" + "".join(lines) + "</g>"
        )
    dots = "".join(
        f'<circle cx="{xs(c):.1f}" cy="{ys(v):.1f}" r="2.5" fill="{POINT_COLOR}" '
        f'fill-opacity="0.7"><title>{e(_point_title(n, d, c, v))}</title></circle>'
        for n, d, c, v in zip(N, D, C, loss, strict=True)
    )
    body.append(f'<g class="points">{dots}</g>')
    svg = chart_svg("frontier", body, "loss against training compute, with the fitted frontier")
    legend = [
        (f'<span class="dot" style="background:{POINT_COLOR}"></span>', "runs"),
        (
            f'<span class="line" style="border-top-color:{FRONTIER_COLOR}"></span>',
            "frontier L*(C), fitted range",
        ),
        (
            f'<span class="line" style="border-top:2px dashed {FRONTIER_COLOR}"></span>',
            "frontier, extrapolated",
        ),
        ('<span class="line" style="border-top:1px dashed #555"></span>', "fitted range of C"),
    ]
    if band is not None:
        legend.append(
            (
                f'<span class="swatch" style="background:{FRONTIER_COLOR};opacity:0.3"></span>',
                f"{100 * level:g}% bootstrap band",
            )
        )
    return svg + _legend(legend), notes


# ---------------------------------------------------------------------------- (2) isoFLOP


def _members(N, D, isoflop: IsoFlopFit, isoflop_C, tol_dex: float) -> list[np.ndarray]:
    """Which points each profile was fitted on: equal budget labels when ``isoflop_C``
    (the C given to ``isoflop_fit``) is known, else 6ND within ``tol_dex`` of its level."""
    if isoflop_C is not None:
        labels = np.broadcast_to(np.asarray(isoflop_C, dtype=np.float64), N.shape)
        return [labels == p.level for p in isoflop.profiles]
    logC = np.log10(flops(N, D))
    return [np.abs(logC - math.log10(p.level)) <= tol_dex + 1e-12 for p in isoflop.profiles]


def isoflop_chart(N, D, loss, params, isoflop: IsoFlopFit, isoflop_C, tol_dex: float) -> str:
    """Chart (2): one group per isoFLOP profile (points, parabola, minimum), then the
    line through the minima used and the law's compute-optimal point at each budget."""
    members = _members(N, D, isoflop, isoflop_C, tol_dex)
    curves = []
    for p, m in zip(isoflop.profiles, members, strict=True):
        if not m.any():
            curves.append(None)
            continue
        lo, hi = float(np.log(N[m].min())), float(np.log(N[m].max()))
        x = np.linspace(lo, hi, 41)
        x_opt = math.log(p.N_opt) if math.isfinite(p.N_opt) and p.N_opt > 0 else math.nan
        if math.isfinite(x_opt) and math.isfinite(p.L_opt):
            # The profile's parabola in vertex form: L_opt + c2 (log N - log N_opt)^2.
            curves.append((np.exp(x), p.L_opt + p.curvature * (x - x_opt) ** 2))
        else:
            curves.append(None)
    try:
        law_opt = [
            (float(compute_optimal(params, p.C)[0]), float(optimal_loss(params, p.C)))
            for p in isoflop.profiles
        ]
    except ValueError:
        law_opt = []
    in_groups = np.any(members, axis=0) if members else np.zeros(N.shape, dtype=bool)
    xs_all = list(N[in_groups]) + [n for n, _ in law_opt]
    ys_all = list(loss[in_groups]) + [v for _, v in law_opt]
    for c in curves:
        if c is not None:
            ys_all += list(c[1])
    xs_all = [v for v in xs_all if math.isfinite(v) and v > 0] or [1.0, 10.0]
    xs = Scale(min(xs_all) / 1.15, max(xs_all) * 1.15, LEFT, W - RIGHT, log=True)
    ys = _y_scale(ys_all)
    body = axes(xs, ys, "parameters N (log scale)", "loss (nat/token)")
    legend = []
    for i, (p, m, curve, used) in enumerate(
        zip(isoflop.profiles, members, curves, isoflop.used, strict=True)
    ):
        color = run_color(i)
        dash = "" if used else ' stroke-dasharray="4 3"'
        why = "" if used else "; not used in the power-law fit (no interior minimum)"
        label = (
            f"budget C={_g(p.C, 3)} (level {_g(p.level, 3)}): {int(m.sum())} points; parabola "
            f"minimum N_opt={_g(p.N_opt, 3)}, L_opt={_g(p.L_opt)}{why}"
        )
        parts = [
            f'<g class="isoflop" data-level="{p.level:.6g}" data-used="{str(used).lower()}">'
            f"<title>{e(label)}</title>"
        ]
        if curve is not None:
            parts.append(
                f'<polyline class="parabola" points="{_coords(xs, ys, *curve)}" fill="none" '
                f'stroke="{color}" stroke-width="1.8"{dash}/>'
            )
        parts += [
            f'<circle cx="{xs(n):.1f}" cy="{ys(v):.1f}" r="2.8" fill="{color}"/>'
            for n, v in zip(N[m], loss[m], strict=True)
        ]
        if p.interior and math.isfinite(p.N_opt) and math.isfinite(p.L_opt):
            x, y = xs(p.N_opt), ys(p.L_opt)
            parts.append(
                f'<path class="minimum" d="M{x:.1f} {y - 6:.1f}L{x + 6:.1f} {y:.1f}'
                f'L{x:.1f} {y + 6:.1f}L{x - 6:.1f} {y:.1f}Z" fill="{color}" stroke="#000"/>'
            )
        body.append("".join(parts) + "</g>")
        legend.append(
            (
                f'<span class="swatch" style="background:{color}"></span>',
                f"C≈{_g(p.C, 2)} (n={int(m.sum())}{'' if used else ', not used'})",
            )
        )
    minima = [
        (p.N_opt, p.L_opt)
        for p, used in zip(isoflop.profiles, isoflop.used, strict=True)
        if used and math.isfinite(p.N_opt) and math.isfinite(p.L_opt)
    ]
    if len(minima) > 1:
        body.append(
            f'<polyline class="optima" points="{_coords(xs, ys, *zip(*minima, strict=True))}" '
            'fill="none" stroke="#000" stroke-width="1" stroke-dasharray="2 3">'
            "<title>isoFLOP minima used in the power-law fit</title></polyline>"
        )
    for (n, v), p in zip(law_opt, isoflop.profiles, strict=True):
        x, y = xs(n), ys(v)
        label = f"fitted law at C={_g(p.C, 3)}: N*={_g(n, 3)}, L*={_g(v)}"
        body.append(
            f'<path class="law-optimum" d="M{x - 4:.1f} {y - 4:.1f}L{x + 4:.1f} {y + 4:.1f}'
            f'M{x - 4:.1f} {y + 4:.1f}L{x + 4:.1f} {y - 4:.1f}" stroke="#000" '
            f'stroke-width="1.5"><title>{e(label)}</title></path>'
        )
    legend += [
        ('<span class="swatch" style="background:#000;transform:rotate(45deg)"></span>', "minimum"),
        ('<span class="line" style="border-top:1px dashed #000"></span>', "minima used"),
        ("<b>&times;</b> ", "the law's compute-optimal N*, L*"),
    ]
    return chart_svg("isoflop", body, "isoFLOP profiles: loss against N per budget") + _legend(
        legend
    )


# ---------------------------------------------------------------------------- (3) residuals


def residual_chart(N, D, loss, residuals) -> str:
    C = flops(N, D)
    xs = Scale(float(C.min()) / 1.2, float(C.max()) * 1.2, LEFT, W - RIGHT, log=True)
    m = max(float(np.max(np.abs(residuals))), 1e-6) * 1.15
    ys = Scale(-m, m, H - BOTTOM, TOP)
    body = axes(xs, ys, "training compute C = 6ND (FLOPs, log scale)", "log L - log L_hat")
    y0 = ys(0.0)
    body.append(
        f'<line class="zero" x1="{LEFT}" y1="{y0:.1f}" x2="{W - RIGHT}" y2="{y0:.1f}" '
        'stroke="#000" stroke-width="1.2"/>'
    )
    dots = "".join(
        f'<circle cx="{xs(c):.1f}" cy="{ys(r):.1f}" r="2.5" fill="{POINT_COLOR}" '
        f'fill-opacity="0.7"><title>{e(_point_title(n, d, c, v) + f"; residual {r:+.4f}")}'
        "</title></circle>"
        for n, d, c, v, r in zip(N, D, C, loss, residuals, strict=True)
    )
    body.append(f'<g class="points">{dots}</g>')
    return chart_svg("residuals", body, "log residuals of the fit against training compute")


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
    isoflop_C: Any = None,
    tol_dex: float = 0.05,
    level: float = LEVEL,
    extend_dex: float = EXTEND_DEX,
) -> str:
    """The whole scaling-law report page, as HTML.

    ``N``, ``D``, ``loss``: the points ``law`` (a fitted ``ScalingLaw``) was fitted on,
    in the same order (its ``residuals_`` are drawn against them). ``boot``: a
    ``Bootstrap`` from ``law.bootstrap`` (or its (n, 5) ``samples``) for the band and the
    parameter intervals. ``isoflop``: an ``IsoFlopFit`` from ``isoflop_fit`` on the same
    points; if it was fitted with per-point budgets ``C=...``, pass them as
    ``isoflop_C``, otherwise points are matched to budgets as ``isoflop_fit`` snapped
    them (6ND within ``tol_dex`` decades). ``title`` is text (escaped). ``level``: the
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

    frontier, notes = frontier_chart(N, D, loss, params, samples, level, extend_dex)
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
        f"range of L*(C).</p>{frontier}" + "".join(f'<p class="note">{e(n)}</p>' for n in notes)
    ]
    if isoflop is not None:
        used = sum(isoflop.used)
        sections.append(
            "<h2>isoFLOP profiles</h2>"
            "<p>Loss against model size at each compute budget, with the parabola in log N "
            "fitted to each profile and its minimum (diamond); dashed profiles have no "
            "interior minimum and were not used. Crosses mark the fitted law's own "
            f"compute-optimal point at each budget. Power law over {used} of "
            f"{len(isoflop.profiles)} budgets: N_opt ∝ C<sup>{e(_g(isoflop.a, 3))}</sup>, "
            f"D_opt ∝ C<sup>{e(_g(isoflop.b, 3))}</sup> (the parametric fit gives "
            f"{e(_g(params.beta / (params.alpha + params.beta), 3))}).</p>"
            + isoflop_chart(N, D, loss, params, isoflop, isoflop_C, tol_dex)
            + f'<p class="note">Grouping: {e(isoflop.rule)}.</p>'
        )
    else:
        sections.append('<h2>isoFLOP profiles</h2><p class="note">No isoFLOP fit was given.</p>')
    sections.append(
        "<h2>Residuals</h2>"
        "<p>log L - log L_hat for each run (above the line: the run did worse than the "
        f"law predicts).</p>{residual_chart(N, D, loss, residuals)}"
    )
    body = f"<h1>{e(title)}</h1>{intro}{''.join(sections)}"
    return page(title, body, _CSS)
