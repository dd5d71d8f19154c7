import json
import re
from pathlib import Path

import pytest

from ledgerlm.config import (
    Recipe,
    RecipeError,
    apply_overrides,
    load_recipe,
    recipe_from_dict,
    recipe_to_toml,
    settings_in_effect,
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


@pytest.mark.parametrize("split", ['"paragraphs"', "5"])
def test_a_wrong_text_split_lists_every_form(tmp_path, split):
    p = _write(tmp_path, f'[data]\nsources = [{{path = "a.txt", split = {split}}}]\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(p)
    assert str(err.value).startswith(f"{p}: data.sources.0.split: expected ")
    assert '"file", "blank_lines", "lines" or {chunk_chars = N}' in str(err.value)


TINY = Path(__file__).parents[1] / "configs" / "tiny.toml"
OWN_TEXT = 'data.sources=["corpus.jsonl"]'


def test_settings_nothing_reads_are_named_with_their_reason():
    assert "eval.target_loss" not in load_recipe(TINY).unused_settings()
    assert "data.builtin" not in load_recipe(TINY).unused_settings()  # the default source
    unused = load_recipe(TINY, [OWN_TEXT, "eval.target_bpb=2.2"]).unused_settings()
    assert unused["eval.target_loss"] == "target_bpb is set"
    assert unused["data.builtin"] == "no source is builtin"
    for builtin in (
        'eval.sources=["builtin:stdlib"]',
        'data.contamination.eval_files=["builtin:stdlib"]',
    ):
        assert "data.builtin" not in load_recipe(TINY, [OWN_TEXT, builtin]).unused_settings()
    muon = load_recipe(TINY, ["train.optimizer=muon", "train.schedule=wsd"]).unused_settings()
    assert "train.muon_lr" not in muon and "train.decay_fraction" not in muon
    assert load_recipe(TINY).unused_settings()["train.muon_lr"] == "optimizer is adamw"
    tokens = load_recipe(TINY, ["train.schedule_unit=tokens", "train.schedule_tokens=1000"])
    assert tokens.unused_settings()["train.warmup_steps"] == "schedule_unit is tokens"
    assert "train.warmup_tokens" not in tokens.unused_settings()


def test_the_resolved_toml_marks_what_nothing_reads_and_still_loads(tmp_path):
    recipe = load_recipe(TINY, [OWN_TEXT, "eval.target_bpb=2.2"])
    text = recipe_to_toml(recipe)
    lines = text.splitlines()
    assert "target_loss = 4.8  # unused: target_bpb is set" in lines
    assert "[data.builtin]  # unused: no source is builtin" in lines
    assert "target_bpb = 2.2" in lines  # in effect: no mark
    again = tmp_path / "resolved.toml"
    again.write_text(text)
    assert load_recipe(again) == recipe


def test_settings_in_effect_drop_what_nothing_reads():
    recipe = load_recipe(TINY, [OWN_TEXT, "eval.target_bpb=2.2"])
    tree = settings_in_effect(recipe.to_dict())
    assert "builtin" not in tree["data"] and "target_loss" not in tree["eval"]
    assert tree["eval"]["target_bpb"] == 2.2 and tree["data"]["sources"] == ["corpus.jsonl"]
    assert "builtin" in recipe.to_dict()["data"]  # the recipe itself is left as it was
    stored = {"name": "old", "train": {"a_setting_since_removed": 1}}
    assert settings_in_effect(stored) == stored  # a stored tree that no longer validates


def test_config_show_json_has_the_unused_table():
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app

    sets = ["--set", OWN_TEXT, "--set", "eval.target_bpb=2.2"]
    shown = CliRunner().invoke(app, ["config", "show", str(TINY), *sets, "--json"])
    assert shown.exit_code == 0, shown.output
    out = json.loads(shown.output)
    assert out["unused"]["eval.target_loss"] == "target_bpb is set"
    assert out["unused"]["data.builtin"] == "no source is builtin"
    assert out["eval"]["target_loss"] == 4.8  # every value is still shown


def test_config_show_piped_at_80_columns_is_a_recipe_that_loads(tmp_path):
    """``config show > r.toml`` keeps a long line whole: the file loads to the same recipe."""
    import os
    import subprocess
    import sys

    long_path = "corpora/" + "a" * 70 + "/second part/" + "b" * 40 + ".jsonl"
    exe = Path(sys.executable).with_name("ledgerlm")
    args = [str(exe), "config", "show", str(TINY), "--set", f'data.sources=["{long_path}"]']
    env = {**os.environ, "COLUMNS": "80"}
    shown = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    (tmp_path / "r.toml").write_text(shown.stdout)
    reread = load_recipe(tmp_path / "r.toml")
    assert reread.data.sources == [long_path]


def test_cost_prices_device_hours_and_the_device_time_budget_is_in_the_contract(tmp_path):
    p = _write(tmp_path, "[cost]\nper_device_hour = {cuda = 2.5, cpu = 0.05}\n")
    r = load_recipe(p, ["cost.per_device_hour.cpu=0.1", "eval.budget_device_hours=0.5"])
    assert r.cost.per_device_hour == {"cuda": 2.5, "cpu": 0.1}
    assert r.eval.contract()["budget_device_hours"] == 0.5
    again = _write(tmp_path, recipe_to_toml(r))
    assert load_recipe(again) == r
    with pytest.raises(RecipeError, match=r"r.toml .*: cost.per_device_hour.*cpu must be >= 0"):
        load_recipe(p, ["cost.per_device_hour.cpu=-1"])
    with pytest.raises(RecipeError, match=r"eval\.budget_device_hours"):
        load_recipe(p, ["eval.budget_device_hours=-1"])
    prices = Recipe.model_fields["cost"].annotation.model_fields["per_device_hour"]
    budget = Recipe.model_fields["eval"].annotation.model_fields["budget_device_hours"]
    assert "device-hour" in prices.description and "device-hours" in budget.description


def test_the_test_split_is_whole_by_default_and_its_cap_is_in_the_contract(tmp_path):
    p = _write(tmp_path, "[eval]\nmax_tokens = 1024\n")
    assert load_recipe(p).eval.test_max_tokens == 0
    assert load_recipe(p).eval.contract()["test_max_tokens"] is None  # the whole split
    r = load_recipe(p, ["eval.test_max_tokens=4096"])
    assert r.eval.contract()["test_max_tokens"] == 4096
    assert r.eval.contract()["val_max_tokens"] == 1024
    assert load_recipe(_write(tmp_path, recipe_to_toml(r))) == r
    with pytest.raises(RecipeError, match=r"eval\.test_max_tokens"):
        load_recipe(p, ["eval.test_max_tokens=-1"])
    cap = Recipe.model_fields["eval"].annotation.model_fields["test_max_tokens"]
    assert "0 = the whole test split" in cap.description


def test_the_stopping_plan_is_off_by_default_and_in_the_contract(tmp_path):
    p = _write(tmp_path, "[eval]\ntarget_loss = 3.0\n")
    r = load_recipe(p)
    assert (r.eval.patience, r.eval.min_delta, r.eval.project) == (0, 0.0, False)
    assert r.unused_settings()["eval.min_delta"] == "patience is 0"
    r = load_recipe(p, ["eval.patience=3", "eval.min_delta=0.01", "eval.project=true"])
    assert "eval.min_delta" not in r.unused_settings()
    c = r.eval.contract()
    assert (c["patience"], c["min_delta"], c["project"]) == (3, 0.01, True)
    assert load_recipe(_write(tmp_path, recipe_to_toml(r))) == r
    for bad in ("eval.patience=-1", "eval.min_delta=-0.1", "eval.project=maybe"):
        with pytest.raises(RecipeError, match=re.escape(bad.split("=")[0])):
            load_recipe(p, [bad])
    fields = Recipe.model_fields["eval"].annotation.model_fields
    assert "0 = off" in fields["patience"].description
    assert "95% interval" in fields["project"].description


def test_from_tune_names_a_study_and_round_trips(tmp_path):
    p = _write(tmp_path, "[train]\nlr = 0.01\n")
    assert load_recipe(p).train.from_tune is None
    r = load_recipe(p, ["train.from_tune=tiny-tune-abc123"])
    assert r.train.from_tune == "tiny-tune-abc123"
    assert r.digest() != load_recipe(p).digest()  # the stored recipe names its study
    assert load_recipe(_write(tmp_path, recipe_to_toml(r))) == r
    with pytest.raises(RecipeError, match=r"train\.from_tune"):
        load_recipe(p, ["train.from_tune=3"])
    field = Recipe.model_fields["train"].annotation.model_fields["from_tune"]
    assert "ledgerlm tune" in field.description and "`search` phase" in field.description
