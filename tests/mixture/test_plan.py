"""The mixture plan (seed 003, section 2): E[D_i] = p_i D and the exposure multiple
e_i = p_i D / S_i, computed by the public API; stages resolved against the budget."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_runner import ledgerlm
from ledgerlm.config import MixtureConfig, RecipeError, recipe_from_dict
from ledgerlm.mixture.plan import DEFAULT_MAX_EPOCHS, exposure, plan_mixture, plan_segments
from ledgerlm.mixture.schedule import resolve

SEED_POOLS = {"web": int(8e9), "code": int(1.5e9), "math": int(0.5e9)}
SEED_WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def test_the_seed_example():
    plan = plan_mixture(SEED_POOLS, SEED_WEIGHTS, int(10e9), max_epochs=4)
    by = {d.domain: d for d in plan.domains}
    assert by["math"].expected_tokens == pytest.approx(2e9)
    assert by["math"].exposure == pytest.approx(4.0)
    assert by["code"].exposure == pytest.approx(2.0)
    assert by["web"].exposure == pytest.approx(0.625)
    assert by["web"].expected_tokens == pytest.approx(5e9)
    # 4 epochs is the limit itself, not above it
    assert plan.warnings == []
    tighter = plan_mixture(SEED_POOLS, SEED_WEIGHTS, int(10e9), max_epochs=3)
    assert [line.split(":")[0] for line in tighter.warnings] == ["domain math"]


def test_the_seed_example_through_the_cli():
    proc = ledgerlm(
        "mix", "plan", "--pools", "web=8e9,code=1.5e9,math=0.5e9",
        "--weights", "web=0.5,code=0.3,math=0.2", "--tokens", "10e9", "--json",
    )  # fmt: skip
    out = {d["domain"]: d for d in json.loads(proc.stdout)["domains"]}
    assert out["math"]["expected_tokens"] == pytest.approx(2e9)
    assert [out[d]["exposure"] for d in ("math", "code", "web")] == pytest.approx([4, 2, 0.625])


def test_an_empty_pool_asked_for_tokens_is_infinite_exposure():
    assert exposure(0.1, 100, 0) == float("inf")
    assert exposure(0.0, 100, 0) == 0.0
    plan = plan_mixture({"a": 0, "b": 10}, {"a": 0.5, "b": 0.5}, 100)
    assert plan.to_dict()["domains"][0]["exposure"] is None  # JSON has no inf
    assert plan.warnings and plan.warnings[0].startswith("domain a")


@given(
    weights=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=6),
    budget=st.integers(1, 10**12),
)
def test_expected_tokens_add_up_to_the_budget_and_follow_the_weights(weights, budget):
    total = sum(weights)
    mix = {f"d{i}": w / total for i, w in enumerate(weights)}
    pools = {d: 1000 * (i + 1) for i, d in enumerate(mix)}
    plan = plan_mixture(pools, mix, budget)
    assert sum(d.expected_tokens for d in plan.domains) == pytest.approx(budget, rel=1e-9)
    # and each domain gets its own share: p_i D tokens, p_i D / S_i epochs
    by = {d.domain: d for d in plan.domains}
    assert sorted(by) == sorted(mix)
    for name, w in mix.items():
        assert by[name].expected_tokens == pytest.approx(w * budget, rel=1e-9)
        assert by[name].weight == pytest.approx(w, rel=1e-9)
        assert by[name].exposure == pytest.approx(w * budget / pools[name], rel=1e-9)


def test_a_staged_mixture_is_resolved_and_planned_per_segment():
    cfg = MixtureConfig.model_validate(
        {
            "weights": {"math": 0.5, "code": 0.5},
            "stages": [
                {"until": 0.5, "weights": "natural"},
                {"until": 800, "weights": {"code": 1.0}},
            ],
        }
    )
    natural = {"code": 0.6, "docs": 0.3, "math": 0.1}
    segments = resolve(cfg, 1000, natural)
    assert [s.end for s in segments] == [500, 800, None]
    assert segments[0].natural and segments[0].weights == natural
    assert segments[2].weights == {"code": 0.5, "docs": 0.0, "math": 0.5}
    plan = plan_segments({"code": 100, "docs": 100, "math": 100}, segments, 1000)
    by = {d.domain: d for d in plan.domains}
    # code: 0.6 x 500 + 1.0 x 300 + 0.5 x 200; docs: 0.3 x 500; math: 0.1 x 500 + 0.5 x 200
    assert by["code"].expected_tokens == pytest.approx(700)
    assert by["docs"].expected_tokens == pytest.approx(150)
    assert by["math"].expected_tokens == pytest.approx(150)
    assert by["code"].weight == pytest.approx(0.7) and by["code"].exposure == pytest.approx(7)
    assert by["code"].over  # 7 epochs > 4


def test_stage_ends_out_of_order_after_resolution_are_refused():
    cfg = MixtureConfig.model_validate(
        {"stages": [{"until": 600, "weights": "natural"}, {"until": 0.5, "weights": "natural"}]}
    )
    with pytest.raises(ValueError, match=r"stages\.1"):
        resolve(cfg, 1000, {"a": 1.0})


def test_a_mixture_naming_an_unknown_domain_is_one_clear_line():
    cfg = MixtureConfig.model_validate({"weights": {"web": 0.5, "code": 0.5}})
    with pytest.raises(ValueError, match=r"domain\(s\) web .*\(domains: code, math\)"):
        resolve(cfg, 1000, {"code": 0.5, "math": 0.5})


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ({"weights": {"a": 0.5, "b": 0.4}}, "weights sum to 0.9, not 1"),
        ({"weights": {"a": 1.5, "b": -0.5}}, "b = -0.5 is negative"),
        ({"weights": "even"}, "Input should be 'natural'"),
        ({"stages": [{"until": 2.0, "weights": "natural"}]}, "share of the token budget"),
        ({"stages": [{"until": 0.5}]}, "stages.0.weights"),
    ],
)
def test_bad_mixtures_in_a_recipe_are_refused(mixture, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"data": {"mixture": mixture}})


def test_the_mixture_is_not_part_of_the_data_version(tmp_path):
    from ledgerlm.data.pipeline import data_version

    natural = recipe_from_dict({})
    mixed = recipe_from_dict({"data": {"mixture": {"weights": {"code": 1.0}}}})
    assert data_version(natural.data, tmp_path)[0] == data_version(mixed.data, tmp_path)[0]
    assert natural.digest() != mixed.digest()  # but a checkpoint knows it


@pytest.mark.parametrize(
    ("weights", "pools", "budget", "message"),
    [
        (
            {"web": 0.5, "code": 0.4},
            {"web": 10, "code": 10},
            100,
            "weights: the weights sum to 0.9, not 1",
        ),
        ({"web": 0.5, "math": 0.5}, {"web": 10}, 100, "weights: no pool given for math"),
        ({"web": 1.0}, {"web": 10}, 0, "budget_tokens: 0 is not a positive number"),
        ({"web": 1.0}, {"web": 10}, float("inf"), "budget_tokens: inf is not a positive number"),
        ({"web": 1.0}, {"web": 10}, float("nan"), "budget_tokens: nan is not a positive number"),
    ],
)
def test_plan_mixture_refuses_what_it_cannot_plan_naming_the_argument(
    weights, pools, budget, message
):
    with pytest.raises(ValueError) as info:
        plan_mixture(pools, weights, budget)
    assert str(info.value) == message


def test_a_plan_without_a_recipe_flags_above_the_recipes_default_epochs():
    assert DEFAULT_MAX_EPOCHS == MixtureConfig().max_epochs == 4.0
    plan = plan_mixture({"web": 10, "code": 10}, {"web": 0.5, "code": 0.5}, 81)
    assert plan.max_epochs == DEFAULT_MAX_EPOCHS
    assert [d.over for d in plan.domains] == [True, True]  # 4.05 epochs each
    pools, even = {"web": 10, "code": 10}, {"web": 0.5, "code": 0.5}
    assert not any(d.over for d in plan_mixture(pools, even, 80).domains)  # 4 is not above
    assert plan_mixture(pools, even, 81, 5.0).warnings == []


def test_mix_plan_errors_name_the_flags():
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app

    pools = ["--pools", "web=8e9,code=1.5e9"]
    for args, line in [
        ([*pools, "--weights", "web=0.5,code=0.4", "--tokens", "1e9"],
         "error: --weights: the weights sum to 0.9, not 1"),
        ([*pools, "--weights", "web=0.5,math=0.5", "--tokens", "1e9"],
         "error: --weights: no pool given for math"),
        ([*pools, "--weights", "web=0.5,code=0.5", "--tokens", "-5"],
         "error: --tokens: -5 is not a positive number"),
        ([*pools, "--weights", "web=0.5,code=x", "--tokens", "1e9"],
         "error: --weights: code: 'x' is not a number"),
    ]:  # fmt: skip
        result = CliRunner().invoke(app, ["mix", "plan", *args])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == line
