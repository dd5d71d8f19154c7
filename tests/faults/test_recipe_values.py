"""Values a recipe must not hold: a non-finite number anywhere in the tree (TOML or
``--set``), and an unknown key inside a source table. Each is one line naming the file
and the key, and nothing is written."""

from __future__ import annotations

import pytest

from cli_runner import TINY, ledgerlm
from ledgerlm.config import RecipeError, load_recipe, recipe_from_dict

NON_FINITE = [
    ("[train]\nlr = inf\n", "train.lr", "inf"),
    ("[train]\nlr = nan\n", "train.lr", "nan"),
    ("[train]\nlr = -inf\n", "train.lr", "-inf"),
    ("[train]\nbetas = [0.9, nan]\n", "train.betas.1", "nan"),
    ("[model]\nffn_mult = inf\n", "model.ffn_mult", "inf"),
    ("[eval]\nbudget_seconds = inf\n", "eval.budget_seconds", "inf"),  # ge=0 let inf pass
    ("[data.near_dedup]\nthreshold = nan\n", "data.near_dedup.threshold", "nan"),
    ("[data]\nsplit_seed = inf\n", "data.split_seed", "inf"),  # an int field
]
OVERRIDES = [
    ("train.lr=inf", "train.lr", "inf"),
    ("train.grad_clip=nan", "train.grad_clip", "nan"),
    ("eval.budget_seconds=+inf", "eval.budget_seconds", "inf"),
    ("data.near_dedup.fp_weight=-nan", "data.near_dedup.fp_weight", "nan"),
]


def _write(tmp_path, body: str):
    path = tmp_path / "r.toml"
    path.write_text('name = "r"\n' + body)
    return path


@pytest.mark.parametrize(("body", "key", "value"), NON_FINITE, ids=[k for _, k, _ in NON_FINITE])
def test_a_non_finite_number_in_toml_names_its_key(tmp_path, body, key, value):
    path = _write(tmp_path, body)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value) == f"{path}: {key}: must be a finite number, got {value}"


@pytest.mark.parametrize(("item", "key", "value"), OVERRIDES, ids=[i for i, _, _ in OVERRIDES])
def test_a_non_finite_override_names_its_key(item, key, value):
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, [item])
    assert str(err.value) == f"{TINY} (with --set): {key}: must be a finite number, got {value}"


def test_a_non_finite_number_in_code_is_refused_too():
    with pytest.raises(RecipeError, match=r"train\.lr: must be a finite number, got inf"):
        recipe_from_dict({"train": {"lr": float("inf")}})


def test_finite_numbers_still_load(tmp_path):
    recipe = load_recipe(_write(tmp_path, "[train]\nlr = 1e-3\nbetas = [0.9, 0.99]\n"))
    assert recipe.train.lr == 1e-3 and recipe.train.betas == (0.9, 0.99)


SOURCES = [
    ('[{path = "a.jsonl", bogus = 1}]', "unknown key 'data.sources.0.bogus'"),
    ('["b.jsonl", {path = "a.jsonl", domian = "web"}]', "unknown key 'data.sources.1.domian'"),
    ('[{format = "jsonl"}]', "data.sources.0.path: Field required"),
    ('[{path = "a.jsonl", format = "csv"}]', "data.sources.0.format: Input should be"),
    ("[1]", "data.sources.0: expected a path or a table {path = ...}"),
]


@pytest.mark.parametrize(("sources", "expected"), SOURCES, ids=[e for _, e in SOURCES])
def test_a_source_table_error_names_its_own_key(tmp_path, sources, expected):
    path = _write(tmp_path, f"[data]\nsources = {sources}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert str(err.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(err.value) and ".str" not in str(err.value)


def test_sources_keep_their_form_and_digest(tmp_path):
    """Paths stay strings and tables stay tables: the data version's hash is unchanged."""
    path = _write(tmp_path, '[data]\nsources = ["a.jsonl", {path = "b.jsonl", domain = "web"}]\n')
    data = load_recipe(path).to_dict()["data"]
    assert data["sources"] == [
        "a.jsonl",
        {"path": "b.jsonl", "format": "auto", "source": None, "domain": "web"},
    ]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "R", "--set", "train.lr=inf"], "train.lr: must be a finite number, got inf"),
        (["data", "prepare", "BOGUS"], "unknown key 'data.sources.0.bogus'"),
    ],
    ids=["run --set", "data prepare"],
)
def test_through_the_cli_one_line_and_nothing_written(tmp_path, args, expected):
    recipe = _write(tmp_path, '[data]\nsources = [{path = "a.jsonl", bogus = 1}]\n')
    args = [str(TINY) if a == "R" else str(recipe) if a == "BOGUS" else a for a in args]
    ws = tmp_path / "ws"
    proc = ledgerlm(*args, "-w", str(ws), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not ws.exists()
