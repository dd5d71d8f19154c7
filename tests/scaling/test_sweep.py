"""Requirement S1: sweep plans (shape rule, token and isoFLOP budgets, tuning rule). Running a
sweep and reading its points back from the ledger: tests/lab/test_sweep_run.py."""

import math

import numpy as np
import pytest
import torch

from cli_runner import TINY
from ledgerlm.config import ModelConfig, load_recipe
from ledgerlm.model.gpt import GPT
from ledgerlm.scaling.sweep import (
    ASPECT_BAND,
    SweepError,
    choose_shape,
    plan,
    smallest_shape,
    sweep_id,
)
from ledgerlm.shape import param_count, tokens_per_update

BASE = load_recipe(TINY)  # d_model 64, 16 rows x 64 positions = 1,024 tokens per step
TPS = 1024
V = 512


@pytest.mark.parametrize(
    ("d", "layers", "vocab", "ffn_mult"),
    [(64, 2, 512, 8 / 3), (80, 2, 512, 8 / 3), (48, 3, 300, 8 / 3), (96, 1, 1000, 3.5)],
)
@pytest.mark.parametrize("tied", [True, False])
def test_param_count_matches_the_model(d, layers, vocab, ffn_mult, tied):
    cfg = ModelConfig(
        d_model=d, n_layers=layers, n_heads=d // 16, ffn_mult=ffn_mult, tie_embeddings=tied
    )
    model = GPT(cfg, vocab)
    counted = model.num_params() if tied else model.num_params(non_embedding=True)
    assert param_count(d, layers, vocab, ffn_mult) == counted
    # N counts the head once (the d x V matrix the last matmul multiplies by), never the lookup
    assert counted == sum(p.numel() for n, p in model.named_parameters() if n != "embed.weight") + (
        d * vocab if tied else 0
    )


def test_the_tiny_recipe_is_its_own_shape():
    shape = choose_shape(133_440, V)  # what `ledgerlm run configs/tiny.toml` reports
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.N) == (64, 2, 2, 133_440)


@pytest.mark.parametrize(
    ("lo", "hi", "tol"), [(2e5, 1e6, 0.08), (1e6, 1e7, 0.04), (1e7, 1e9, 0.015)]
)
def test_realized_n_is_close_to_the_target(lo, hi, tol):
    for target in np.geomspace(lo, hi, 40):
        shape = choose_shape(round(target), V)
        assert abs(shape.N / target - 1) <= tol, (target, shape)
        d, layers = shape.d_model, shape.n_layers
        assert d % 16 == 0 and d % shape.n_heads == 0 and (d // shape.n_heads) % 2 == 0
        assert ASPECT_BAND[0] <= d / layers <= ASPECT_BAND[1]
        assert param_count(d, layers, V) == shape.N
        ModelConfig(d_model=d, n_layers=layers, n_heads=shape.n_heads)  # a valid config


def test_tiny_range_sizes_land_within_a_few_percent():
    for target in (2e5, 5e5, 1e6, 2e6):
        assert abs(choose_shape(round(target), V).N / target - 1) < 0.03


def test_grid_of_tokens():
    points = plan(BASE, [2e5, 5e5], tokens=[1e5, 2e5])
    assert tokens_per_update(BASE) == TPS
    assert [(p.target_N, p.target_D) for p in points] == [
        (200_000, 100_000),
        (200_000, 200_000),
        (500_000, 100_000),
        (500_000, 200_000),
    ]
    for p in points:
        assert p.max_steps == math.ceil(p.target_D / TPS)
        assert p.max_steps * TPS == p.D and p.target_D <= p.D < p.target_D + TPS
        assert p.C == 6 * p.N * p.D and p.target_C is None
        assert p.name == f"N{p.N / 1000:.3g}k-D{p.D / 1000:.3g}k"
        r = p.recipe(BASE)
        assert (r.model.d_model, r.model.n_layers, r.model.n_heads) == (
            p.d_model,
            p.n_layers,
            p.n_heads,
        )
        assert r.train.max_steps == p.max_steps and r.train.lr == BASE.train.lr
        assert r.eval.stop_at_target is False and r.eval.budget_tokens == 0
        assert r.eval.every_steps == math.ceil(p.max_steps / 8)
        assert r.train.warmup_steps == max(1, round(5 / 200 * p.max_steps))
        # only the model, the schedule and the evaluation cadence change: same data
        assert r.digest("data", "tokenizer", "pack") == BASE.digest("data", "tokenizer", "pack")
        assert all(o.split(".")[0] in ("model", "train", "eval") for o in p.overrides)
        GPT(r.model, V)  # builds


def test_isoflop_points_have_d_equal_c_over_6n():
    budgets = [1e11, 3e11]
    points = plan(BASE, [1e5, 2e5, 4e5], flops=budgets)
    assert len(points) == 6
    assert [p.target_C for p in points] == [1e11] * 3 + [3e11] * 3
    for p in points:
        exact = p.target_C / (6 * p.N)
        assert p.max_steps == math.ceil(exact / TPS)
        assert exact <= p.D < exact + TPS  # whole optimizer steps
        assert p.C == 6 * p.N * p.D
        assert pytest.approx(p.target_C, rel=TPS / exact) == p.C
    # on one isoFLOP curve, the bigger model trains on fewer tokens
    first = points[:3]
    assert [p.N for p in first] == sorted(p.N for p in first)
    assert [p.D for p in first] == sorted((p.D for p in first), reverse=True)


def test_plans_are_deterministic():
    a = plan(BASE, [3e5, 1e6], tokens=[5e4, 1.5e5], lr_rule="sqrt")
    b = plan(BASE, [3e5, 1e6], tokens=[5e4, 1.5e5], lr_rule="sqrt")
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]


def test_a_sweep_id_is_its_plans_hash():
    # the same plan, the same id (so running it again continues it); another grid, rule
    # or seed, another id
    grid = ([3e5, 1e6], [5e4, 1.5e5])
    same = sweep_id(BASE, plan(BASE, *grid))
    assert same == sweep_id(BASE, plan(BASE, *grid)) and same.startswith("tiny-sweep-")
    seeded = load_recipe(TINY, ["train.seed=7"])
    others = {
        sweep_id(BASE, plan(BASE, [3e5, 1e6], [5e4, 2e5])),
        sweep_id(BASE, plan(BASE, *grid, lr_rule="sqrt")),
        sweep_id(seeded, plan(seeded, *grid)),
    }
    assert same not in others and len(others) == 3


def test_the_tuning_rule_is_explicit_and_recorded():
    fixed = plan(BASE, [5e5], tokens=[1e5])[0]
    sqrt = plan(BASE, [5e5], tokens=[1e5], lr_rule="sqrt")[0]
    assert fixed.lr == BASE.train.lr
    assert sqrt.lr == pytest.approx(BASE.train.lr * math.sqrt(64 / sqrt.d_model))
    assert f"train.lr={sqrt.lr!r}" in sqrt.overrides
    assert sqrt.recipe(BASE).train.lr == sqrt.lr
    assert sqrt.rule["lr_rule"] == "sqrt" and sqrt.rule["base_d_model"] == 64
    assert sqrt.rule["base_lr"] == BASE.train.lr and sqrt.rule["tokens_per_step"] == TPS


def test_a_token_schedule_is_stretched_to_the_budget():
    base = load_recipe(
        TINY,
        ["train.schedule_unit=tokens", "train.schedule_tokens=200000", "train.warmup_tokens=10000"],
    )
    p = plan(base, [2e5], tokens=[1e5])[0]
    r = p.recipe(base)
    assert r.train.schedule_tokens == p.D and r.train.warmup_tokens == round(0.05 * p.D)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": [5e3], "tokens": [1e5]}, "below the smallest shape"),
        ({"sizes": [2e5], "tokens": [1000]}, "less than one optimizer step"),
        ({"sizes": [2e5], "tokens": [1.5 * TPS]}, "more than 25%"),
        ({"sizes": [2e5], "tokens": [1e5], "flops": [1e11]}, "exactly one of the two"),
        ({"sizes": [2e5]}, "exactly one of the two"),
        ({"sizes": [], "tokens": [1e5]}, "no sizes"),
        ({"sizes": [-1], "tokens": [1e5]}, "not a positive number"),
        ({"sizes": [2e5], "tokens": [float("nan")]}, "not a positive number"),
        ({"sizes": [2e5], "tokens": [1e5], "lr_rule": "cube"}, "choose one of fixed, sqrt"),
        ({"sizes": [1e5, 1.01e5], "tokens": [1e5]}, "give the same run"),
        ({"sizes": [2e5], "flops": [1e6]}, "less than one optimizer step"),
    ],
)
def test_impossible_points_are_one_clear_error(kwargs, message):
    with pytest.raises(SweepError, match=message) as err:
        plan(BASE, **kwargs)
    assert "\n" not in str(err.value)


def test_a_continued_run_cannot_be_swept():
    base = load_recipe(TINY, ["train.init_from=some-run"])
    with pytest.raises(SweepError, match="from scratch"):
        plan(base, [2e5], tokens=[1e5])


def test_smallest_shape():
    small = smallest_shape(V)
    assert (small.d_model, small.n_layers) == (16, 1)
    assert choose_shape(small.N, V) == small


def test_param_count_of_a_real_tiny_model():
    torch.manual_seed(0)
    assert GPT(BASE.model, V).num_params() == param_count(64, 2, V) == 133_440
