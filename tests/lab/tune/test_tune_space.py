"""A study's ``--param`` lines: each kind read with its bounds, each key and extreme value
checked against the recipe before anything runs, one line naming the param when bad;
the grid of choice and int params; a trial's values as the ``--set`` strings the
recipe takes back to the same values."""

from __future__ import annotations

import pytest

from cli_runner import TINY
from ledgerlm.config import apply_overrides, load_recipe, recipe_from_dict
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.tune import space
from ledgerlm.lab.tune.study import plan_study


@pytest.fixture(scope="module")
def base():
    return load_recipe(TINY)


def test_every_kind_is_read_with_its_bounds(base):
    lr, warm, seq, opt, wd = space.parse_space(
        [
            "train.lr=log:1e-4:3e-2",
            "train.warmup_steps=int:0:100:10",
            "pack.seq_len=choice:64,128,256",
            "train.optimizer=choice:adamw,muon",
            "train.weight_decay=float:0:0.2",
        ],
        base,
    )
    assert (lr.kind, lr.low, lr.high) == ("log", 1e-4, 3e-2)
    assert lr.distribution().log and not wd.distribution().log
    assert (warm.low, warm.high, warm.step) == (0, 100, 10)
    assert seq.choices == (64, 128, 256) and opt.choices == ("adamw", "muon")
    assert warm.grid() == list(range(0, 101, 10))
    assert space.grid([seq, opt]) == {
        "pack.seq_len": [64, 128, 256],
        "train.optimizer": ["adamw", "muon"],
    }
    assert space.grid_size([warm, seq]) == 33


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("train.lr", "expected section.key=KIND:SPEC"),
        ("train.lr=exp:1:2", "expected section.key=KIND:SPEC"),
        ("train.lr=log:0:1", "a log range lies above 0"),
        ("train.lr=float:1:1", "LOW must be below HIGH"),
        ("train.lr=float:a:1", "'a' is not a finite number"),
        ("train.lr=float:1:2:3", "expected float:LOW:HIGH"),
        ("train.warmup_steps=int:0:1.5", "'1.5' is not an integer"),
        ("train.warmup_steps=int:0:10:3", "STEP must be at least 1 and divide HIGH - LOW"),
        ("pack.seq_len=choice:64,,128", "an empty choice"),
        ("pack.seq_len=choice:64,64", "a value is given twice"),
        ("train.lrr=log:1e-4:1e-2", "unknown key 'train.lrr'; did you mean lr?"),
        ("train.max_steps=int:0:10", "train.max_steps=0: train.max_steps: Input should be"),
        ("train.optimizer=choice:adamw,sgd", 'train.optimizer="sgd": train.optimizer'),
    ],
)
def test_a_bad_line_is_one_line_naming_the_param(base, line, why):
    with pytest.raises(ArgumentError) as err:
        space.parse_space([line], base)
    text = err.value.worded({"param": "--param"})
    assert text.startswith(f"--param {line!r}: ") and why in text
    assert "\n" not in text


def test_a_key_searched_twice_or_no_param_is_refused(base):
    with pytest.raises(ArgumentError, match=r"train\.lr is searched twice"):
        space.parse_space(["train.lr=log:1e-4:1e-2", "train.lr=choice:0.1"], base)
    with pytest.raises(ArgumentError, match="give at least one"):
        space.parse_space([], base)


def test_the_grid_refuses_a_float_range_with_its_reason(base):
    with pytest.raises(ArgumentError, match="grid sampler takes choice and int params only"):
        plan_study(base, ["train.lr=log:1e-4:1e-2"], sampler="grid")
    spec = plan_study(base, ["pack.seq_len=choice:64,128"], sampler="grid", trials=16)
    assert spec.trials == 2  # cut to the grid's size


def test_overrides_read_back_to_the_same_values(base):
    params = space.parse_space(
        [
            "train.lr=log:1e-5:1e-2",
            "train.optimizer=choice:adamw,muon",
            "pack.seq_len=choice:64,128",
        ],
        base,
    )
    values = {"train.lr": 1.25e-05, "train.optimizer": "muon", "pack.seq_len": 128}
    sets = space.overrides(params, values)
    assert sets == ["train.lr=1.25e-05", 'train.optimizer="muon"', "pack.seq_len=128"]
    recipe = recipe_from_dict(apply_overrides(base.to_dict(), sets))
    assert (recipe.train.lr, recipe.train.optimizer, recipe.pack.seq_len) == (1.25e-05, "muon", 128)
    assert space.toml_value(True) == "true" and space.toml_value("true") == '"true"'


def test_the_same_plan_gets_the_same_id_and_another_plan_another(base):
    one = plan_study(base, ["train.lr=log:1e-4:1e-2"], trials=4)
    assert one.study == plan_study(base, ["train.lr=log:1e-4:1e-2"], trials=4).study
    assert one.study.startswith("tiny-tune-") and len(one.study) == len("tiny-tune-") + 6
    assert one.plan["seed"] == base.train.seed
    for other in (
        plan_study(base, ["train.lr=log:1e-4:1e-2"], trials=5),
        plan_study(base, ["train.lr=log:1e-4:1e-2"], trials=4, seed=7),
        plan_study(base, ["train.lr=log:1e-4:1e-2"], trials=4, pruner="median"),
        plan_study(load_recipe(TINY, ["train.max_steps=50"]), ["train.lr=log:1e-4:1e-2"], trials=4),
    ):
        assert other.study != one.study
    with pytest.raises(ArgumentError, match="expected a name"):
        plan_study(base, ["train.lr=log:1e-4:1e-2"], study="x" * 99)
