"""Requirements S3 (compute-optimal allocation with its interval), S4 (lifecycle cost), S5
(budget)."""

import numpy as np
import pytest

from ledgerlm.scaling.allocate import (
    TABLE_COLUMNS,
    allocation_with_interval,
    compute_optimal,
    extrapolation_warning,
    inference_flops,
    lifecycle_optimal,
    lifecycle_table,
    optimal_loss,
)
from ledgerlm.scaling.law import LawParams, flops

SEED = LawParams(E=0.0, A=1.0, B=1.0, alpha=0.34, beta=0.28)
CHIN = LawParams(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)


# --------------------------------------------------------------------------- S3


def test_seed_example_closed_form():
    N, D = compute_optimal(SEED, 256.0, kappa=1.0)
    assert round(float(N), 3) == 16.734
    assert round(float(D), 3) == 15.298
    assert float(N * D) == pytest.approx(256.0, rel=1e-12)


def test_first_order_condition_and_neighbours_on_budget_line():
    p = SEED
    N, D = (float(x) for x in compute_optimal(p, 256.0, kappa=1.0))
    lhs = p.alpha * p.A * N ** (-p.alpha)
    rhs = p.beta * p.B * D ** (-p.beta)
    assert lhs == pytest.approx(rhs, rel=1e-12)
    best = float(p.predict(N, D))
    for f in (0.5, 0.9, 0.99, 1.01, 1.1, 2.0):
        n = N * f
        assert float(p.predict(n, 256.0 / n)) > best


def test_vectorised_over_budgets_and_scaling_exponents():
    C = np.logspace(18, 24, 7)
    N, D = compute_optimal(CHIN, C)
    assert N.shape == D.shape == C.shape
    np.testing.assert_allclose(flops(N, D), C, rtol=1e-12)
    s = CHIN.alpha + CHIN.beta
    # N* ~ C^(beta/(alpha+beta)), D* ~ C^(alpha/(alpha+beta))
    np.testing.assert_allclose(np.diff(np.log(N)) / np.diff(np.log(C)), CHIN.beta / s, rtol=1e-9)
    np.testing.assert_allclose(np.diff(np.log(D)) / np.diff(np.log(C)), CHIN.alpha / s, rtol=1e-9)
    L = optimal_loss(CHIN, C)
    assert np.all(np.diff(L) < 0) and np.all(L > CHIN.E)


def test_rejects_bad_params_and_budget():
    with pytest.raises(ValueError):
        compute_optimal(LawParams(1.0, 1.0, 1.0, -0.1, 0.3), 1e20)
    with pytest.raises(ValueError):
        compute_optimal(CHIN, 0.0)


# --------------------------------------------------------------------------- S5


def test_seed_003_budget_example():
    c = float(flops(10e9, 200e9))
    assert c == pytest.approx(1.2e22, rel=1e-12)
    assert float(flops(20e9, 100e9)) == pytest.approx(c, rel=1e-12)  # 20e9 params: 100e9 tokens
    # both shapes lie on the same budget line; the law decides which is better,
    # and the compute-optimal point beats both
    N, D = compute_optimal(CHIN, c)
    assert float(flops(N, D)) == pytest.approx(c, rel=1e-12)
    best = float(CHIN.predict(N, D))
    assert best < float(CHIN.predict(10e9, 200e9))
    assert best < float(CHIN.predict(20e9, 100e9))


# --------------------------------------------------------------------------- interval


def _samples(spread: float, n: int = 400, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    center = CHIN.as_array()
    return center * np.exp(spread * rng.standard_normal((n, 5)))


def test_interval_carried_through_contains_point_and_widens_with_spread():
    C = 1e22
    narrow = allocation_with_interval(_samples(0.01), C, params=CHIN)
    wide = allocation_with_interval(_samples(0.05), C, params=CHIN)
    N_p, D_p = compute_optimal(CHIN, C)
    assert narrow["N_opt"]["point"] == pytest.approx(float(N_p))
    assert narrow["D_opt"]["point"] == pytest.approx(float(D_p))
    for key in ("N_opt", "D_opt", "tokens_per_param", "loss"):
        for out in (narrow, wide):
            assert out[key]["lo"] <= out[key]["point"] <= out[key]["hi"], key
        assert wide[key]["hi"] / wide[key]["lo"] > narrow[key]["hi"] / narrow[key]["lo"], key
    assert narrow["n_samples"] == narrow["n_valid"] == 400
    assert narrow["level"] == 0.95


def test_interval_vectorised_drops_failed_samples_and_uses_median_without_params():
    S = _samples(0.02)
    S[:3, 3] = np.nan  # failed refits
    S[3, 4] = -0.1
    C = np.array([1e20, 1e22, 1e24])
    out = allocation_with_interval(S, C, level=0.9)
    assert out["n_samples"] == 400 and out["n_valid"] == 396
    assert out["N_opt"]["lo"].shape == (3,)
    assert np.all(out["N_opt"]["lo"] <= out["N_opt"]["point"])
    assert np.all(out["N_opt"]["point"] <= out["N_opt"]["hi"])
    assert np.all(np.diff(out["N_opt"]["point"]) > 0)
    with pytest.raises(ValueError):
        allocation_with_interval(np.full((5, 5), np.nan), 1e22)
    with pytest.raises(ValueError):
        allocation_with_interval(S[:, :4], 1e22)


# --------------------------------------------------------------------------- extrapolation


@pytest.mark.parametrize(
    "range_",
    [
        {"N": (1e6, 1e8), "D": (1e8, 1e10), "C": (1e15, 1e18)},
        {
            "N": {"min": 1e6, "max": 1e8},
            "D": {"min": 1e8, "max": 1e10},
            "C": {"min": 1e15, "max": 1e18},
        },
        {"N_min": 1e6, "N_max": 1e8, "D_min": 1e8, "D_max": 1e10, "C_min": 1e15, "C_max": 1e18},
    ],
)
def test_extrapolation_warning(range_):
    assert extrapolation_warning(range_, C=1e17, N=1e7, D=1e9) is None
    assert extrapolation_warning(range_, C=1e18, N=1e6) is None  # edges are inside
    msg = extrapolation_warning(range_, C=1e20)
    assert msg is not None and "\n" not in msg
    assert "C=1e+20" in msg and "100x above" in msg
    msg = extrapolation_warning(range_, N=2e5, D=np.array([1e9, 5e10]))
    assert "N=2e+05 is 5x below" in msg and "D=5e+10 is 5x above" in msg


# --------------------------------------------------------------------------- S4


def test_inference_flops_is_forward_only():
    assert float(inference_flops(1e9, 1000)) == 2e12
    assert float(inference_flops(1e9, 1000, inference_kappa=3.0)) == 3e12


def test_lifecycle_zero_requests_equals_compute_optimal():
    C = 1e23
    plan = lifecycle_optimal(CHIN, requests=0, tokens_per_request=1000, budget=C)
    n_opt, d_opt = compute_optimal(CHIN, C)
    np.testing.assert_allclose([plan.N, plan.D], [n_opt, d_opt], rtol=1e-9)
    assert plan.C_total == pytest.approx(C, rel=1e-12)
    # the target version at R = 0 is the compute-optimal point for the budget reaching it
    target = float(optimal_loss(CHIN, C))
    plan_t = lifecycle_optimal(CHIN, requests=0, tokens_per_request=1000, target_loss=target)
    np.testing.assert_allclose(plan_t.N, n_opt, rtol=1e-6)
    assert plan_t.C_total == pytest.approx(C, rel=1e-9)


@pytest.mark.parametrize("mode", ["budget", "target"])
def test_lifecycle_moves_to_smaller_models_trained_longer_as_requests_grow(mode):
    kw = {"budget": 1e23} if mode == "budget" else {"target_loss": 2.05}
    R = [0, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13]
    rows = lifecycle_table(CHIN, R, 1000, **kw)
    assert [r["R"] for r in rows] == R
    assert all(tuple(r) == TABLE_COLUMNS for r in rows)
    N = np.array([r["N"] for r in rows])
    tpp = np.array([r["tokens_per_param"] for r in rows])
    assert np.all(np.diff(N) < 0)
    assert np.all(np.diff(tpp) > 0)
    for r in rows:
        assert r["C_total"] == pytest.approx(r["C_train"] + r["C_inference_total"], rel=1e-12)
        assert r["C_inference_total"] == pytest.approx(r["R"] * 2 * r["N"] * 1000, rel=1e-12)
    if mode == "budget":
        assert all(r["C_total"] == pytest.approx(1e23, rel=1e-9) for r in rows)
        assert np.all(np.diff([r["loss"] for r in rows]) > 0)


def test_lifecycle_budget_optimum_beats_neighbours():
    budget, R, tpr = 1e23, 1e10, 1000
    plan = lifecycle_optimal(CHIN, requests=R, tokens_per_request=tpr, budget=budget)
    for f in (0.8, 0.98, 1.02, 1.2):
        n = plan.N * f
        d = (budget - R * 2 * n * tpr) / (6 * n)
        assert float(CHIN.predict(n, d)) > plan.loss


def test_lifecycle_target_reached_at_least_total_cost():
    target, R, tpr = 2.05, 1e10, 1000
    plan = lifecycle_optimal(CHIN, requests=R, tokens_per_request=tpr, target_loss=target)
    assert float(CHIN.predict(plan.N, plan.D)) == pytest.approx(target, rel=1e-9)
    assert plan.loss == pytest.approx(target, rel=1e-9)
    for f in (0.9, 0.99, 1.01, 1.5):
        n = plan.N * f
        d = (CHIN.B / (target - CHIN.E - CHIN.A * n ** (-CHIN.alpha))) ** (1 / CHIN.beta)
        assert 6 * n * d + R * 2 * n * tpr > plan.C_total


def test_lifecycle_errors():
    with pytest.raises(ValueError, match="unreachable"):
        lifecycle_optimal(CHIN, requests=1e9, tokens_per_request=1000, target_loss=1.69)
    with pytest.raises(ValueError, match="unreachable"):
        lifecycle_optimal(CHIN, requests=0, tokens_per_request=1000, target_loss=1.5)
    with pytest.raises(ValueError, match="exactly one"):
        lifecycle_optimal(CHIN, requests=0, tokens_per_request=1000)
    with pytest.raises(ValueError, match="exactly one"):
        lifecycle_optimal(CHIN, requests=0, tokens_per_request=1000, target_loss=2.0, budget=1e23)
    with pytest.raises(ValueError):
        lifecycle_optimal(CHIN, requests=-1, tokens_per_request=1000, budget=1e23)


def test_a_degenerate_fit_gives_a_clear_error_not_a_crash():
    # What a 6-point tiny sweep can produce: the N term underflows along the budget line.
    degenerate = LawParams(E=5.1, A=7.8e206, B=4.3e7, alpha=44.0, beta=1.87)
    with pytest.raises(ValueError, match="no lifecycle optimum found"):
        lifecycle_table(degenerate, [0, 1e6], 1000, budget=1e12)
