"""Seed 002, section 3 and seed 003, sections 6.1.1 and 6.4: compute growth, the
normalised n * d = 1 curve and the dense score cells of longer contexts, through the
scaling law, its compute-optimal allocation and the attention mask.

Already asserted (not repeated here): N* = 16.734 / D* = 15.298 at C = ND = 256 and
10B x 200B = 1.2e22 FLOPs -> 100B tokens at 20B (tests/scaling/test_allocate.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from ledgerlm.model.attention import attention_mask
from ledgerlm.scaling.allocate import compute_optimal
from ledgerlm.scaling.law import LawParams, flops

N0, D0 = 1e9, 20e9


def test_doubling_n_and_d_quadruples_compute():
    # seed 002, 3: "N、D 各增加两倍，总计算约增为四倍" (C proportional to N D): 6 N D
    # FLOPs of 1e9 parameters x 20e9 tokens is 1.2e20, of twice each 4.8e20
    assert float(flops(N0, D0)) == pytest.approx(1.2e20, rel=1e-15)
    assert float(flops(2 * N0, 2 * D0)) == pytest.approx(4.8e20, rel=1e-15)


@pytest.mark.parametrize("c", [4.0, 9.0, 10.0, 100.0])
def test_balanced_growth_takes_sqrt_c_each(c):
    # seed 002, 3: "预算扩大 c 倍时二者均增至 sqrt(c) 倍" when N and D grow alike; by
    # section 8 (N* ~ C^(beta/(alpha+beta)), D* ~ C^(alpha/(alpha+beta))) that is the
    # compute-optimal growth exactly when alpha = beta, whatever A and B
    law = LawParams(E=1.7, A=400.0, B=410.0, alpha=0.3, beta=0.3)
    budget = float(flops(N0, D0))
    n0, d0 = (float(x) for x in compute_optimal(law, budget))
    n, d = (float(x) for x in compute_optimal(law, c * budget))
    assert n / n0 == pytest.approx(math.sqrt(c), rel=1e-12)
    assert d / d0 == pytest.approx(math.sqrt(c), rel=1e-12)
    assert float(flops(n, d)) == pytest.approx(c * budget, rel=1e-12)  # the budget, spent


SEED_LAW = LawParams(E=0.0, A=1.0, B=1.0, alpha=0.34, beta=0.28)


@pytest.mark.parametrize("c", [4.0, 100.0])
def test_with_unequal_exponents_compute_growth_is_not_split_alike(c):
    # seed 002, 3: "这是一个计数例子，不是最优分配定律"; requirement S3's worked example (A = B = 1,
    # alpha = .34, beta = .28, C = N D = 256 -> N* = 16.734, D* = 15.298) grown by c:
    # N* by c^(.28/.62), D* by c^(.34/.62), the data taking the larger share
    n, d = (float(x) for x in compute_optimal(SEED_LAW, 256.0 * c, kappa=1.0))
    assert n == pytest.approx(16.734 * c ** (0.28 / 0.62), rel=1e-4)
    assert d == pytest.approx(15.298 * c ** (0.34 / 0.62), rel=1e-4)
    assert n / 16.734 < math.sqrt(c) < d / 15.298


def test_an_allocation_growing_n_and_d_alike_fails_the_seed_s_growth(monkeypatch):
    # the check above is not vacuous: compute_optimal splitting every budget sqrt/sqrt
    # (right at C = 256 by construction, wrong growth) fails it
    import ledgerlm.scaling.allocate as allocate

    def alike(A, B, alpha, beta, C, kappa):
        budget = C / kappa
        n = 16.734 * (budget / 256.0) ** 0.5
        return n, budget / n

    monkeypatch.setattr(allocate, "_optimum", alike)
    with pytest.raises(AssertionError):
        test_with_unequal_exponents_compute_growth_is_not_split_alike(4.0)


# seed 003, 6.1.1: n = N/N0, d = D/D0 with n d = 1, alpha = gamma = 1, both coefficients 1,
# no constant floor: model term 1/n, data term 1/d = n, total 1/n + n
UNIT_LAW = LawParams(E=0.0, A=1.0, B=1.0, alpha=1.0, beta=1.0)


@pytest.mark.parametrize(
    ("n", "model_term", "data_term", "total"),
    [(0.5, 2.0, 0.5, 2.5), (1.0, 1.0, 1.0, 2.0), (2.0, 0.5, 2.0, 2.5)],
)
def test_the_n_d_equals_1_curve(n, model_term, data_term, total):
    d = 1 / n
    assert float(UNIT_LAW.predict(n, math.inf)) == pytest.approx(model_term)  # data term 0
    assert float(UNIT_LAW.predict(math.inf, d)) == pytest.approx(data_term)  # model term 0
    assert float(UNIT_LAW.predict(n, d)) == pytest.approx(total)


def test_the_n_d_equals_1_curve_is_lowest_at_the_balance_n_equals_d_equals_1():
    # "n = 1 时为 1 与 1、合计 2": with alpha = gamma and A = B the balance is n = d
    n_star, d_star = compute_optimal(UNIT_LAW, 1.0, kappa=1.0)
    assert (float(n_star), float(d_star)) == pytest.approx((1.0, 1.0))
    assert float(UNIT_LAW.predict(n_star, d_star)) == pytest.approx(2.0)


@pytest.mark.parametrize(("length", "cells", "readable"), [(4, 16, 10), (8, 64, 36)])
def test_dense_score_cells_of_a_longer_context(length, cells, readable):
    # seed 003, 6.4: lengths 4 and 8 give 16 and 64 query x key score cells; causally
    # readable and masked cells both count in dense attention
    mask = attention_mask(torch.zeros(1, length, dtype=torch.long), "cross")[0, 0]
    assert mask.shape == (length, length)
    assert mask.numel() == cells
    assert int(mask.sum()) == readable  # i >= j: length (length + 1) / 2


def test_doubling_the_context_quadruples_the_score_cells():
    short, long = (attention_mask(torch.zeros(1, t, dtype=torch.long), "cross") for t in (4, 8))
    assert long.numel() / short.numel() == 4
