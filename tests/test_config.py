from pathlib import Path

import pytest

from ledgerlm.config import (
    Recipe,
    RecipeError,
    apply_overrides,
    load_recipe,
    recipe_from_dict,
    recipe_to_toml,
)

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_recipe_parses_and_round_trips(path, tmp_path):
    recipe = load_recipe(path)
    again = tmp_path / "resolved.toml"
    again.write_text(recipe_to_toml(recipe))
    assert load_recipe(again) == recipe


def test_shipped_recipes_exist():
    assert {p.stem for p in CONFIGS} >= {"demo", "tiny"}


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "r.toml"
    p.write_text(text)
    return p


def test_unknown_key_names_key_and_file(tmp_path):
    p = _write(tmp_path, "[train]\nlearning_rate = 0.1\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(p)
    assert str(p) in str(err.value)
    assert "unknown key 'train.learning_rate'" in str(err.value)


def test_unknown_section_is_an_error(tmp_path):
    with pytest.raises(RecipeError, match="unknown key 'trian'"):
        load_recipe(_write(tmp_path, "[trian]\nlr = 0.1\n"))


def test_wrong_type_names_key_and_file(tmp_path):
    p = _write(tmp_path, '[model]\nd_model = "wide"\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(p)
    assert str(p) in str(err.value) and "model.d_model" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="not found"):
        load_recipe(tmp_path / "nope.toml")


def test_invalid_toml(tmp_path):
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(_write(tmp_path, "[train\n"))


def test_overrides_parse_toml_values(tmp_path):
    p = _write(tmp_path, "[train]\nlr = 0.1\n")
    r = load_recipe(p, ["train.lr=3e-4", "pack.attention=cross", "eval.stop_at_target=false"])
    assert r.train.lr == 3e-4
    assert r.pack.attention == "cross"
    assert r.eval.stop_at_target is False
    assert r.name == "r"


def test_override_unknown_key_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown key .train\.lrr."):
        load_recipe(_write(tmp_path, ""), ["train.lrr=1"])


def test_override_needs_equals():
    with pytest.raises(RecipeError, match=r"section\.key=value"):
        apply_overrides({}, ["train.lr"])


def test_model_shape_is_validated():
    with pytest.raises(RecipeError, match="divisible"):
        recipe_from_dict({"model": {"d_model": 30, "n_heads": 4}})


def test_digest_depends_on_named_sections_only():
    a = Recipe()
    b = Recipe.model_validate({"train": {"lr": 1e-4}})
    assert a.digest("data", "tokenizer") == b.digest("data", "tokenizer")
    assert a.digest() != b.digest()
