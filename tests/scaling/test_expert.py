"""What an expert does around the fit, on synthetic laws with known answers: replicates
and duplicates, identification diagnostics, extrapolation in tokens per parameter,
held-out errors with their bias, and CSV tables with their own column names."""

from __future__ import annotations

import numpy as np
import pytest

from ledgerlm.scaling.diagnose import diagnose
from ledgerlm.scaling.fit import EXPONENT_MAX, LOG_SCALE_MAX, ScalingLaw
from ledgerlm.scaling.law import NAMES, LawParams
from ledgerlm.scaling.replicates import group_ids, reduce_replicates
from ledgerlm.scaling.table import drop_top_loss, load_epoch_chinchilla, read_points
from reference_data import REFERENCE_CSV, reference_points

TRUE = LawParams(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)


def grid(noise=0.01, seed=0, law=TRUE):
    """6 sizes x 5 token counts, multiplicative noise on the loss."""
    rng = np.random.default_rng(seed)
    N = np.repeat(np.logspace(7, 9, 6), 5)
    D = np.tile(np.logspace(9, 11, 5), 6)
    return N, D, law.predict(N, D) * np.exp(rng.normal(0, noise, N.size))


# ------------------------------------------------------------------- replicates


def test_duplicated_rows_do_not_shrink_the_intervals():
    N, D, loss = grid()
    once = ScalingLaw().fit(N, D, loss).bootstrap(100, seed=3)
    twice = ScalingLaw().fit(np.r_[N, N], np.r_[D, D], np.r_[loss, loss]).bootstrap(100, seed=3)
    # the same (N, D) groups are drawn, each weighing twice: the same refits up to the
    # optimizer's tolerance (a bootstrap over rows would narrow them by about 1/sqrt(2))
    for name in ("E", "alpha", "beta"):
        (lo1, hi1), (lo2, hi2) = once.interval(name), twice.interval(name)
        assert hi2 - lo2 == pytest.approx(hi1 - lo1, rel=0.01), name
    reduced = reduce_replicates(np.r_[N, N], np.r_[D, D], np.r_[loss, loss], "none")
    assert reduced.duplicates == 30 and reduced.replicated == 30
    assert "30 row(s) repeat an earlier row exactly" in reduced.warnings()[0]


def test_best_keeps_the_lowest_loss_of_each_learning_rate_group():
    N, D, loss = grid()
    # three learning rates per (N, D): the tuned one, and two that are 3% and 8% worse
    N3, D3 = np.tile(N, 3), np.tile(D, 3)
    L3 = np.r_[loss * 1.03, loss, loss * 1.08]
    best = reduce_replicates(N3, D3, L3, "best")
    np.testing.assert_array_equal(best.loss, loss)
    np.testing.assert_array_equal(best.kept, np.arange(30, 60))
    assert best.groups == 30 and best.replicated == 30 and best.duplicates == 0
    assert best.note() == (
        "90 rows, 30 distinct (N, D); 30 with several rows reduced to the lowest loss (best)"
    )
    mean = reduce_replicates(N3, D3, L3, "mean")
    np.testing.assert_allclose(mean.loss, loss * (1.03 + 1 + 1.08) / 3)
    with pytest.raises(ValueError, match="reduce must be one of"):
        reduce_replicates(N3, D3, L3, "median")


def test_the_default_reduction_is_best_only_where_learning_rates_differ():
    from ledgerlm.lab.scaling.fit import FitOptions, fit
    from ledgerlm.lab.scaling.points import FitPoints

    N, D, loss = grid()
    lr = np.full(60, 1e-3)  # two seeds of each (N, D) at one learning rate
    rows = (np.r_[N, N], np.r_[D, D], np.r_[loss, loss * 1.01], {"csv": "runs.csv"})
    assert fit(FitPoints(*rows, lr=lr), FitOptions(n_boot=0)).reduction.how == "none"
    lr[37] = 3e-3  # one (N, D), rows 7 and 37, tried at two learning rates
    assert fit(FitPoints(*rows, lr=lr), FitOptions(n_boot=0)).reduction.how == "best"


def test_best_and_mean_equal_a_loop_over_the_groups():
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(1, 50))
        N, D = rng.integers(1, 4, n).astype(float), rng.integers(1, 3, n).astype(float)
        loss = rng.integers(1, 4, n) + 1.0  # ties within a group: the first row is kept
        gid = group_ids(N, D)
        groups = [np.flatnonzero(gid == g) for g in range(gid.max() + 1)]
        best = reduce_replicates(N, D, loss, "best")
        assert best.kept.tolist() == [rows[np.argmin(loss[rows])] for rows in groups]
        np.testing.assert_array_equal(best.loss, loss[best.kept])
        mean = reduce_replicates(N, D, loss, "mean")
        assert mean.kept.tolist() == [rows[0] for rows in groups]
        np.testing.assert_allclose(mean.loss, [loss[rows].mean() for rows in groups], rtol=1e-15)


def test_group_ids_follow_first_appearance():
    assert group_ids([3, 1, 3, 2], [5, 5, 5, 5]).tolist() == [0, 1, 0, 2]
    rng = np.random.default_rng(5)  # against a dictionary of first appearances
    for _ in range(50):
        N, D = rng.integers(1, 4, (2, int(rng.integers(1, 40)))).astype(float)
        first: dict = {}
        want = [first.setdefault((n, d), len(first)) for n, d in zip(N, D, strict=True)]
        assert group_ids(N, D).tolist() == want


# ------------------------------------------------------------------- diagnostics


def test_an_identified_law_and_a_degenerate_one():
    N, D, loss = grid()
    law = ScalingLaw().fit(N, D, loss)
    d = diagnose(law.params_, loss.min(), law.bootstrap(100).intervals())
    assert d.status == "identified", d.problems()
    # no irreducible loss: E is driven to ~0 and said to be unidentified
    N, D, loss = grid(law=LawParams(E=0.0, A=400.0, B=410.0, alpha=0.34, beta=0.28))
    law = ScalingLaw().fit(N, D, loss)
    d = diagnose(law.params_, loss.min(), law.bootstrap(50).intervals())
    assert 0.05 * loss.min() > law.params_.E
    assert d.status == "degenerate"
    (e,) = [p for p in d.params if p.name == "E"]
    assert e.status == "degenerate" and "irreducible loss is not identified" in e.reasons[0]


def test_an_exponent_whose_interval_reaches_zero_is_degenerate():
    # loss barely depends on D: beta's interval reaches 0
    flat = LawParams(E=1.7, A=400.0, B=0.05, alpha=0.34, beta=0.05)
    d = diagnose(flat, 1.9, {"beta": (-0.02, 0.2), "alpha": (0.3, 0.38)})
    (beta,) = [p for p in d.params if p.name == "beta"]
    assert beta.status == "degenerate" and "reaches 0" in beta.reasons[0]
    assert d.status == "degenerate"


def test_a_non_finite_interval_is_never_identified():
    p = LawParams(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)
    nan, inf = float("nan"), float("inf")
    intervals = {"E": (1.6, nan), "A": (68.5, nan), "B": (nan, nan), "alpha": (0.3, inf)}
    d = diagnose(p, 1.9, {**intervals, "beta": (0.27, 0.29)})
    by = {c.name: c for c in d.params}
    for name, (lo, hi) in intervals.items():
        assert by[name].status == "degenerate", by[name]
        assert f"its interval [{lo:.3g}, {hi:.3g}] is not finite" in by[name].reasons[0]
    assert by["beta"].status == "identified" and d.status == "degenerate"


def test_a_fit_or_interval_on_the_edge_of_the_searched_box_is_degenerate():
    # six points, one with a loss of 1e300: unbounded, the refits overflowed A = e^a
    # (A in [6.4e-08, nan]); in the box, refits run to its edges instead
    rng = np.random.default_rng(6)
    N, D = np.logspace(7, 9, 6), np.logspace(9, 11, 6)[rng.permutation(6)]
    loss = TRUE.predict(N, D) * np.exp(rng.normal(0, 0.01, 6))
    loss[3] = 1e300
    law = ScalingLaw().fit(N, D, loss)
    found = law.bootstrap(100).intervals()
    assert all(np.isfinite(v).all() for v in found.values()), found
    assert found["alpha"][1] == EXPONENT_MAX  # some refits ran to the largest exponent
    by = {c.name: c for c in diagnose(law.params_, loss.min(), found).params}
    assert by["alpha"].status == "degenerate", by["alpha"]
    assert "reaches the edge of the searched box (alpha = 5, the highest" in by["alpha"].reasons[0]
    # an estimate on an edge (an exponent at 0 or 5, log A at its largest)
    on_edge = LawParams(E=1.7, A=float(np.exp(LOG_SCALE_MAX)), B=410.0, alpha=0.0, beta=5.0)
    by = {c.name: c for c in diagnose(on_edge, 1.9).params}
    statuses = [by[k].status for k in NAMES]
    assert statuses == ["identified", "degenerate", "identified", "degenerate", "degenerate"]
    assert "the fit ran to the edge of the searched box (a = 300, the highest" in by["A"].reasons[0]
    assert "(alpha = 0, the lowest searched)" in by["alpha"].reasons[0]
    assert "(beta = 5, the highest searched)" in by["beta"].reasons[0]


def test_points_that_do_not_determine_the_law_give_a_finite_degenerate_fit():
    # the 3 x 2 tiny sweep's final losses (tests/e2e/test_scale.py): the loss at the
    # middle size is the lowest, so the objective keeps falling towards a step between
    # sizes (unbounded: alpha -> 41, beta -> 106, B = e^1053 overflows to inf)
    N = np.repeat([52_368.0, 83_136.0, 133_440.0], 2)
    D = np.tile([20_480.0, 40_960.0], 3)
    loss = np.array([5.59474741, 5.24198041, 5.50691822, 5.17903946, 5.51404961, 5.23190554])
    law = ScalingLaw().fit(N, D, loss)
    assert np.isfinite(law.params_.as_array()).all() and np.isfinite(law.predict(N, D)).all()
    assert law.params_.alpha == EXPONENT_MAX
    found = law.bootstrap(20).intervals()
    d = diagnose(law.params_, loss.min(), found)
    assert d.status == "degenerate"
    by = {c.name: c for c in d.params}
    assert "ran to the edge of the searched box (alpha = 5" in by["alpha"].reasons[0]


def test_wide_intervals_and_grid_edges_are_weak():
    p = LawParams(E=1.7, A=400.0, B=410.0, alpha=2.6, beta=0.28)
    d = diagnose(p, 1.9, {"A": (10.0, 5000.0), "alpha": (2.0, 3.0)})
    by = {c.name: c for c in d.params}
    assert by["A"].status == "weakly identified" and "spans 500x" in by["A"].reasons[0]
    assert by["alpha"].status == "weakly identified"
    assert "above the search grid (alpha in [0, 2], got 2.6)" in by["alpha"].reasons[0]
    assert by["B"].status == "identified" and d.status == "weakly identified"


# ------------------------------------------------------------------- extrapolation


def test_an_over_trained_point_inside_every_axis_range_is_flagged():
    # fitted runs all train 20-40 tokens per parameter, over a wide range of N and D
    N = np.logspace(7, 9, 12)
    D = N * np.tile([20.0, 40.0], 6)
    law = ScalingLaw().fit(N, D, TRUE.predict(N, D))
    lo, hi = law.range_["D/N"]
    assert lo == pytest.approx(20.0) and hi == pytest.approx(40.0)
    # N = 1e7 with D = 2e10: both inside their ranges, C too, but 2000 tokens a parameter
    n, d = 1e7, 2e10
    assert law.range_["N"][0] <= n <= law.range_["N"][1]
    assert law.range_["D"][0] <= d <= law.range_["D"][1]
    assert law.range_["C"][0] <= 6 * n * d <= law.range_["C"][1]
    assert law.extrapolates(n, d)
    assert not law.extrapolates(1e8, 3e9)  # 30 tokens a parameter: inside


# ------------------------------------------------------------------- held-out errors


def test_held_out_errors_name_the_bias():
    N, D, loss = grid(noise=0.0)
    law = ScalingLaw().fit(N, D, loss)
    observed = loss[:4] + np.array([0.1, 0.2, 0.3, 0.2])  # reached worse than promised
    out = law.evaluate_held_out(N[:4], D[:4], observed)
    assert out.bias == pytest.approx(-0.2, abs=1e-6)  # optimistic by 0.2 nat
    assert out.mae == pytest.approx(0.2, abs=1e-6)
    assert out.rmse == pytest.approx(np.sqrt(np.mean(np.array([0.1, 0.2, 0.3, 0.2]) ** 2)))
    assert out.max_rel_error == pytest.approx(np.max(np.abs(out.errors) / observed))
    assert set(out.to_dict()) >= {"mae", "rmse", "bias", "max_rel_error"}


# ------------------------------------------------------------------- tables


def test_columns_of_ones_own_naming(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("params,flops,val_loss,learning_rate\n1e8,6e18,3.1,0.001\n2e8,6e18,3.0,0.002\n")
    t = read_points(path)
    assert t.columns == {"N": "params", "D": "flops / (6 N)", "loss": "val_loss",
                         "lr": "learning_rate"}  # fmt: skip
    np.testing.assert_allclose(t.D, [1e10, 5e9])
    assert t.lr.tolist() == [0.001, 0.002] and t.lines.tolist() == [2, 3]
    named = tmp_path / "named.csv"
    named.write_text("size,seen,final\n1e8,2e9,3.1\n")
    t = read_points(named, n_col="size", d_col="seen", loss_col="final")
    assert (t.N[0], t.D[0], t.loss[0]) == (1e8, 2e9, 3.1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("N,D,loss\n1e8,2e9,3.1\n1e8,nan,3.0\n", r"runs.csv:3: column 'D': 'nan'"),
        ("N,D,loss\n1e8,2e9,-1\n", r"runs.csv:2: column 'loss': '-1'"),
        ("N,D,loss\n1e8,2e9,3.1\n1e8,4e9,inf\n", r"runs.csv:3: column 'loss': 'inf' is not a"),
        ("N,D,loss\n1e8,2e9,1e300\n", r"runs.csv:2: column 'loss': '1e300' is not a loss in"),
        ("N,D,loss\n1e8,2e9,100.5\n", r"runs.csv:2: column 'loss': '100.5' is not a loss in"),
        ("N,D,loss\n1e8,,3\n", r"runs.csv:2: column 'D': ''"),
        ("size,D,loss\n1e8,2e9,3\n", r"missing column\(s\) for N \(N or n or params"),
        ("size,D,loss\n1e8,2e9,3\n", r"for N \(N or .* or model_size; or name it with n_col\)$"),
        (
            "N,loss\n1e8,3\n",
            r"missing column\(s\) for D or C \(tokens or compute; d_col or c_col\)",
        ),
        ("N,D,loss\n", r"runs.csv: no rows"),
    ],
)
def test_bad_tables_name_the_file_line_and_column(tmp_path, text, message):
    (tmp_path / "runs.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_points(tmp_path / "runs.csv")


def test_a_named_column_that_is_absent(tmp_path):
    (tmp_path / "runs.csv").write_text("N,D,loss\n1e8,2e9,3\n")
    with pytest.raises(ValueError, match="no column 'lr' for lr"):
        read_points(tmp_path / "runs.csv", lr_col="lr")


def test_epochs_chinchilla_table_reads_as_it_is():
    reference = reference_points()
    raw = read_points(REFERENCE_CSV)  # its own column names, recognised
    assert len(raw.N) == 245 and raw.columns["N"] == "Model Size"
    assert raw.columns["D"] == "Training FLOP / (6 N)"
    # first row: Model Size 6795600349.289497, Training FLOP 9.993852799709755e+18
    assert raw.N[0] == 6795600349.289497
    assert raw.D[0] == pytest.approx(9.993852799709755e18 / (6 * 6795600349.289497), rel=1e-15)
    assert raw.loss.max() > 5.0 and reference.loss.max() < 3.5
    trimmed = drop_top_loss(raw, 5)
    np.testing.assert_array_equal(trimmed.N, reference.N)
    np.testing.assert_array_equal(load_epoch_chinchilla(REFERENCE_CSV).loss, raw.loss)
