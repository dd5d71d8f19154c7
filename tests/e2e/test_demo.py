"""The demo recipe: its target means something, and (slow) the demo reaches it."""

import pytest

from ledgerlm.cli.recipes import shipped_recipe
from ledgerlm.config import load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.tokens.loader import validation_batches
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.evaluate import unigram_entropy
from ledgerlm.workspace import Workspace

from .conftest import ledgerlm


def test_demo_target_is_well_below_the_unigram_entropy_of_its_validation_set(tmp_path):
    recipe = load_recipe(shipped_recipe("demo"))
    ws = Workspace(tmp_path)
    tokens = build_tokens(prepare_data(recipe.data, ws), recipe.tokenizer, ws)
    store = TokenStore(tokens.path)
    val = validation_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
    assert {"code", "docs", "math"} <= set(store.domains)
    # reaching the target needs at least 1 nat/token from context
    assert recipe.eval.target_loss < unigram_entropy(val) - 1.0


@pytest.mark.slow
def test_demo_reaches_its_target(tmp_path):
    out = ledgerlm("demo", "-w", str(tmp_path)).stdout
    assert "target reached at step" in out
