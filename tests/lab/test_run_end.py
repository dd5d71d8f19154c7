"""How a run ends: its final checkpoint is written the way its periodic ones are (the
trainer's checkpoint callback), so at the last step it holds what a periodic checkpoint
there holds; a run that never confirmed its target is tested on its final weights."""

import json
import shutil
from pathlib import Path

import pytest

from ledgerlm.config import load_recipe
from ledgerlm.lab import skeleton
from ledgerlm.lab.export import load_run_model
from ledgerlm.lab.run import run_recipe
from ledgerlm.tokens.loader import test_batches
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.checkpoint import STATE, WEIGHTS, resolve_checkpoint
from ledgerlm.train.checkpointing import checkpointer, save_training
from ledgerlm.train.evaluate import evaluate, weights_digest
from ledgerlm.workspace import Workspace

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
STEPS = 6


class _KeepPeriodic:
    """After the periodic checkpoint at the last step (the callback before this one
    wrote it), keep a copy: the final checkpoint replaces it."""

    def __init__(self, into: Path) -> None:
        self.into = into

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == STEPS:
            shutil.copytree(resolve_checkpoint(checkpointer(trainer).folder), self.into)

    def on_train_end(self, trainer) -> None:
        pass


def _state(folder: Path) -> dict:
    state = json.loads((folder / STATE).read_text())
    state.pop("state_sha256")  # of the content, compared below
    return state


def _final_and_periodic(tmp_path: Path) -> None:
    every = f"={STEPS}"
    sets = ["train.max_steps", "train.checkpoint_every", "eval.every_steps"]
    recipe = load_recipe(TINY, [s + every for s in sets] + ["train.threads=1"])
    periodic = tmp_path / "periodic"
    result = run_recipe(recipe, Workspace(tmp_path / "ws"), callbacks=[_KeepPeriodic(periodic)])
    final = resolve_checkpoint(tmp_path / "ws" / "runs" / result.run_id / "checkpoint")
    kept, last = _state(periodic), _state(final)
    assert last["step"] == kept["step"] == STEPS
    # training has ended since: the only difference is why it stopped
    assert kept["trainer"]["state"]["stop_reason"] == ""
    assert last["trainer"]["state"]["stop_reason"] == "max_steps"
    kept["trainer"]["state"]["stop_reason"] = "max_steps"
    assert last == kept
    assert last["run_id"] == result.run_id and last["recipe_sha256"] == recipe.digest()
    assert (final / WEIGHTS).read_bytes() == (periodic / WEIGHTS).read_bytes()


def test_the_final_checkpoint_holds_what_a_periodic_one_at_its_step_holds(tmp_path):
    _final_and_periodic(tmp_path)


def test_a_second_save_path_for_the_final_checkpoint_is_caught(tmp_path, monkeypatch):
    """Mutation check: a final checkpoint saved beside the callback, without the state
    the run hands it (run id, recipe digest), fails the comparison above."""

    class _Beside:
        def __init__(self, trainer) -> None:
            self.folder = checkpointer(trainer).folder

        def write(self, trainer, **more) -> Path:
            return save_training(self.folder, trainer, more)

    monkeypatch.setattr(skeleton, "checkpointer", _Beside)
    with pytest.raises(AssertionError):
        _final_and_periodic(tmp_path)


def test_the_test_score_is_the_final_weights_on_the_test_split(tmp_path):
    sets = ["train.max_steps=4", "eval.every_steps=4", "data.test_fraction=0.1"]
    recipe = load_recipe(TINY, [*sets, "train.threads=1"])
    ws = Workspace(tmp_path)
    result = run_recipe(recipe, ws)
    (event,) = [e for e in result.summary["events"] if e["kind"] == "test_evaluation"]
    record = json.loads(event["message"])
    final = load_run_model(ws, result.run_id).model  # the final checkpoint's weights
    store = TokenStore(result.tokens.path)
    test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
    metrics = evaluate(final, test, recipe.pack.attention, store.domains, text=store.text)
    assert record["step"] == 4 and record["snapshot"] == weights_digest(final)
    assert record["role"] == "final"  # the target (4.8 nat/token) is not reached in 4 steps
    assert result.summary["time_to_target"]["reached"] is False
    assert record["targets"] == sum(b.num_targets for b in test) > 0
    assert record["metrics"] == {f"test/{k}": v for k, v in metrics.items()}
