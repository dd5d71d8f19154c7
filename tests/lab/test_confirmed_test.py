"""The test split is scored whole, on the snapshot that confirmed the target and on the
final weights when they differ: each a test_evaluation event in an eval phase of its
own, after the target (never on its bill). Every figure is checked against the same
weights rescored independently (copied by a callback at each update)."""

import json
from pathlib import Path

import pytest

from kill_at import KillAt, Killed
from ledgerlm.config import load_recipe
from ledgerlm.lab.export import load_run_model
from ledgerlm.lab.resume import resume_run
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger.target import charged
from ledgerlm.tokens.loader import test_batches
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.evaluate import EvalCallback, evaluate, weights_digest
from ledgerlm.workspace import Workspace

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
# confirmed at the first evaluation (step 4: any loss under 7 nat/token), 8 updates
BASE = [
    "train.max_steps=8",
    "eval.every_steps=4",
    "eval.target_loss=7.0",
    "data.test_fraction=0.1",
    "train.threads=1",
]


class _Weights:
    """A copy of the weights after every update (the evaluator has seen it by then)."""

    def __init__(self) -> None:
        self.at: dict[int, dict] = {}

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        state = trainer.model.state_dict()
        self.at[trainer.state.step] = {k: v.detach().clone() for k, v in state.items()}

    def on_train_end(self, trainer) -> None:
        pass


def _run(ws: Workspace, *sets: str, callbacks=()):
    recipe = load_recipe(TINY, [*BASE, *sets])
    return recipe, run_recipe(recipe, ws, callbacks=list(callbacks))


def _tests(summary) -> list[dict]:
    found = [e for e in summary["events"] if e["kind"] == "test_evaluation"]
    return [json.loads(e["message"]) for e in found]


def _rescored(ws, result, recipe, weights=None) -> tuple[str, dict, int]:
    """The digest and test metrics of ``weights`` (the final checkpoint's when None),
    scored apart from the run on the whole test split, and its number of targets."""
    model = load_run_model(ws, result.run_id).model
    if weights is not None:
        model.load_state_dict(weights)
    store = TokenStore(result.tokens.path)
    test = test_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
    metrics = evaluate(model, test, recipe.pack.attention, store.domains, text=store.text)
    return (
        weights_digest(model),
        {f"test/{k}": v for k, v in metrics.items()},
        sum(b.num_targets for b in test),
    )


@pytest.fixture(scope="module")
def went_on(tmp_path_factory):
    """A run that confirms its target at step 4 and trains on to step 8."""
    ws = Workspace(tmp_path_factory.mktemp("went_on"))
    weights = _Weights()
    recipe, result = _run(ws, "eval.stop_at_target=false", callbacks=[weights])
    return ws, recipe, result, weights


def test_a_run_that_goes_on_past_its_target_is_tested_on_both_snapshots(went_on):
    ws, recipe, result, weights = went_on
    summary = result.summary
    assert summary["time_to_target"]["step"] == 4
    confirming, final = _tests(summary)
    assert (confirming["role"], confirming["step"]) == ("confirming", 4)
    assert (final["role"], final["step"]) == ("final", 8)
    assert confirming["snapshot"] != final["snapshot"]
    by_step = {e["step"]: e for e in summary["evaluations"]}
    assert confirming["snapshot"] == by_step[4]["snapshot"]
    # the confirming snapshot's figures are those of the weights at step 4, rescored
    digest, metrics, targets = _rescored(ws, result, recipe, weights.at[4])
    assert digest == confirming["snapshot"]
    assert confirming["metrics"] == metrics and confirming["targets"] == targets > 0
    digest, metrics, targets = _rescored(ws, result, recipe)
    assert (digest, final["metrics"], final["targets"]) == (final["snapshot"], metrics, targets)
    assert confirming["seconds"] > 0 and final["seconds"] > 0
    # the whole test split of the token version: every pair of a document's tokens
    # (BOS ... EOS) a target, but where a row of seq_len + 1 ends inside one
    docs = TokenStore(result.tokens.path).split_docs("test")
    pairs, rows = (
        int(docs["length"].sum()) + len(docs["length"]),
        -(-targets // recipe.pack.seq_len),
    )
    assert pairs - 2 * rows < targets <= pairs
    assert recipe.eval.max_tokens < targets  # the validation cap does not apply


def test_each_test_is_an_eval_phase_after_the_target_off_its_bill(went_on):
    _, _, result, _ = went_on
    summary = result.summary
    phases = [p for p in summary["phases"] if str(p["detail"].get("what", "")).startswith("test")]
    assert [p["detail"]["what"] for p in phases] == [
        "test set, confirming snapshot",
        "test set, final weights",
    ]
    assert all(p["kind"] == "eval" for p in phases)
    confirming = summary["time_to_target"]["evaluation"]
    billed = {p["id"] for p in charged(summary["phases"], confirming)}
    assert billed and not billed & {p["id"] for p in phases}
    # the seconds on each record are those its own phase measured, within its bounds
    for phase, record in zip(phases, _tests(summary), strict=True):
        assert 0 < record["seconds"] <= phase["seconds"]


def test_a_run_that_stops_on_its_confirming_snapshot_records_one_test(tmp_path):
    ws = Workspace(tmp_path)
    recipe, result = _run(ws)  # stop_at_target: the final weights are step 4's
    (record,) = _tests(result.summary)
    assert (record["role"], record["step"]) == ("confirming", 4)
    digest, metrics, _ = _rescored(ws, result, recipe)
    assert record["snapshot"] == digest and record["metrics"] == metrics


class _Kept:
    """What the run's evaluator kept of its confirming snapshot, once training ended."""

    kept: object = "unseen"

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        pass

    def on_train_end(self, trainer) -> None:
        (evaluator,) = [cb for cb in trainer.callbacks if isinstance(cb, EvalCallback)]
        self.kept = evaluator.kept


def test_a_confirmation_on_the_final_weights_keeps_no_copy_of_them(tmp_path):
    """stop_at_target off, the target confirmed at the last update: the final weights
    are the confirming snapshot, so nothing is copied and one test is recorded."""
    seen, went = _Kept(), _Kept()
    sets = ["eval.stop_at_target=false", "eval.every_steps=8"]
    _, result = _run(Workspace(tmp_path), *sets, callbacks=[seen])
    (record,) = _tests(result.summary)
    assert (record["role"], record["step"]) == ("confirming", 8) and seen.kept is None
    _run(Workspace(tmp_path), "eval.stop_at_target=false", callbacks=[went])  # confirmed at 4
    assert went.kept and all(w.device.type == "cpu" for w in went.kept)  # a CPU copy


def test_an_asynchronous_confirmation_is_tested_on_the_copy_that_scored_it(tmp_path):
    ws = Workspace(tmp_path)
    weights = _Weights()
    recipe, result = _run(ws, "eval.asynchronous=true", callbacks=[weights])
    confirming, final = _tests(result.summary)
    assert (confirming["role"], confirming["step"]) == ("confirming", 4)
    assert final["role"] == "final" and final["step"] > 4
    digest, metrics, _ = _rescored(ws, result, recipe, weights.at[4])
    assert confirming["snapshot"] == digest and confirming["metrics"] == metrics


def test_a_run_resumed_from_its_confirming_snapshot_tests_it_as_the_uninterrupted_run(
    went_on, tmp_path
):
    _, _, uninterrupted, _ = went_on
    ws = Workspace(tmp_path)
    with pytest.raises(Killed):  # checkpointed at the confirming step 4, killed at 6
        _run(ws, "eval.stop_at_target=false", "train.checkpoint_every=4", callbacks=[KillAt(6)])
    resumed = resume_run(ws, "latest")
    assert _tests(resumed.summary) == [
        {**t, "seconds": s["seconds"]}
        for t, s in zip(_tests(uninterrupted.summary), _tests(resumed.summary), strict=True)
    ]


def test_a_run_resumed_past_its_confirmation_tests_the_final_weights_and_says_why(tmp_path):
    ws = Workspace(tmp_path)
    with pytest.raises(Killed):  # confirmed at 4, checkpointed at 6, killed at 7
        _run(ws, "eval.stop_at_target=false", "train.checkpoint_every=6", callbacks=[KillAt(7)])
    resumed = resume_run(ws, "latest")
    (record,) = _tests(resumed.summary)
    assert (record["role"], record["step"]) == ("final", 8)
    assert "step 4" in record["note"] and "not kept" in record["note"]


def test_a_confirming_copy_training_moved_on_is_caught(tmp_path, monkeypatch):
    """Mutation check: an evaluator that keeps the trainer's own parameters rather than
    a copy (training then moves them on) is refused at the test by the digest of the
    weights it would score, and the run fails rather than record the wrong snapshot."""

    def aliases(self, trainer, weights):
        self.kept = [p.detach() for p in trainer.model.parameters()]

    monkeypatch.setattr(EvalCallback, "keep", aliases)
    with pytest.raises(RuntimeError, match="confirming snapshot's weights digest"):
        _run(Workspace(tmp_path), "eval.stop_at_target=false")
