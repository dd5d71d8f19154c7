"""``train.from_tune``: a run of a study's base recipe trains its best trial's values and
is charged the study (a ``search`` phase holding its wall and device time, its trials'
bill); a study under way, another recipe, or a tuned parameter set to another value is
refused in one line. The study is written with ``lab.tune.record``, its trials are runs
of a real SQLite ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerlm.config import apply_overrides, load_recipe
from ledgerlm.lab import searches
from ledgerlm.lab.searches import resolve_searches, resolved_recipe, use_tune
from ledgerlm.lab.tune import record as rec
from ledgerlm.ledger import Ledger
from ledgerlm.workspace import Workspace

TINY = Path(__file__).parents[2] / "configs" / "tiny.toml"
STUDY = "tiny-tune-abc123"
# trial number -> (status, lr, warmup, value, seconds of its one phase)
TRIALS = {
    0: ("reached", 0.001, 0, 9.0, 4.0),
    1: ("reached", 0.01, 10, 3.0, 2.0),  # the best
    2: ("pruned", 0.03, 0, None, 1.0),
    3: ("failed", 0.1, 10, None, 0.5),
}


def _overrides(lr: float, warmup: int) -> list[str]:
    return [f"train.lr={lr}", f"train.warmup_steps={warmup}"]


def _study(ws: Workspace, complete: bool = True, only: tuple[int, ...] = (0, 1, 2, 3)) -> dict:
    base = load_recipe(TINY)
    plan = {"base_recipe": base.name, "base_recipe_sha256": base.digest(), "trials": 4}
    record = rec.start_record(ws, STUDY, plan, "time")
    with Ledger(ws.ledger_path) as ledger:
        for n in only:
            status, lr, warmup, value, seconds = TRIALS[n]
            tree = apply_overrides(base.to_dict(), _overrides(lr, warmup))
            tree["name"] = rec.trial_name(STUDY, n)
            run = ledger.create_run(
                tree["name"], tree, target_metric="loss", target_value=4.8, eval_every=25
            )
            ledger.record_phase(run, "train", seconds)
            ledger.finish_run(run, status)
            row = {"number": n, "name": tree["name"], "run": run, "status": status}
            row.update(value=value, params={"train.lr": lr}, overrides=_overrides(lr, warmup))
            rec.put_trial(record, {**row, "attempt": 1, "device_seconds": seconds})
    record.update(complete=complete, seconds=10.0)
    rec.write_record(ws, record)
    return record


def _tuned(ws: Workspace, *more: str):
    recipe = load_recipe(TINY, ["train.from_tune=tiny-tune", *more])  # a unique prefix
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        return use_tune(recipe, ws, ledger)


def test_the_best_trials_values_are_trained_and_the_stored_recipe_names_the_study(tmp_path):
    ws = Workspace(tmp_path)
    _study(ws)
    recipe, study = _tuned(ws)
    assert study["study"] == STUDY and study["best"]["number"] == 1
    assert recipe.train.lr == 0.01 and recipe.train.warmup_steps == 10
    assert recipe.train.from_tune == STUDY and recipe.name == load_recipe(TINY).name
    # the stored recipe resolves to itself (a resume, ``continue_run``'s digest)
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        again, _ = use_tune(recipe, ws, ledger)
    assert again == recipe
    assert resolved_recipe(recipe, ws) == recipe
    assert resolved_recipe(load_recipe(TINY, ["train.from_tune=latest"]), ws) == recipe
    # a recipe that names no study is left as it is
    plain = load_recipe(TINY)
    assert use_tune(plain, ws) == (plain, None)


def test_the_study_is_charged_with_its_trials_bill(tmp_path):
    ws = Workspace(tmp_path)
    record = _study(ws)
    with Ledger(ws.ledger_path) as ledger:
        recipe, (found,) = resolve_searches(load_recipe(TINY, [f"train.from_tune={STUDY}"]), ws,
                                            ledger)  # fmt: skip
        run = ledger.create_run("r", recipe.to_dict(), target_metric="loss", target_value=4.8,
                                eval_every=25)  # fmt: skip
        searches.charge_search(ledger, run, found)
        summary = ledger.run_summary(run)
    (phase,) = [p for p in summary["phases"] if p["kind"] == "search"]
    assert phase["seconds"] == pytest.approx(10.0)  # the study's wall time
    detail = phase["detail"]
    assert detail["kind"] == "tune" and detail["search_id"] == STUDY
    assert detail["trials"] == [t["run"] for t in record["trials"]]
    # its device time: the study's (7.5 s of trials); the 2.5 s around them on no device
    assert detail["device_seconds"] == pytest.approx(record["device_seconds"]) == 7.5
    groups = detail["bill"]["groups"]
    assert {g: v["trials"] for g, v in groups.items()} == {
        "reached": 2, "not reached": 0, "pruned": 1, "failed": 1, "running": 0
    }  # fmt: skip
    assert groups["reached"]["seconds"] == pytest.approx(6.0)
    assert detail["bill"]["outside"]["seconds"] == pytest.approx(2.5)
    assert summary["phase_device_totals"]["search"] == pytest.approx(7.5)  # on the run's bill


def test_a_study_still_under_way_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    _study(ws, complete=False, only=(0, 1))
    with pytest.raises(ValueError, match=r"has no result yet \(2 of 4 trials done\): run the same "
                       "`ledgerlm tune` again"):  # fmt: skip
        _tuned(ws)


def test_a_study_with_no_ranked_trial_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    _study(ws, only=(2, 3))
    with pytest.raises(ValueError, match="has no best trial"):
        _tuned(ws)


def test_another_recipe_is_refused_naming_the_keys_that_differ(tmp_path):
    ws = Workspace(tmp_path)
    _study(ws)
    with pytest.raises(ValueError, match=r"not the study's base recipe: model.d_model, "
                       r"train.max_steps differ"):  # fmt: skip
        _tuned(ws, "model.d_model=32", "train.max_steps=7")
    with pytest.raises(ValueError, match="base recipe: name differ"):
        _tuned(ws, "name=other")


def test_a_tuned_parameter_set_to_another_value_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    _study(ws)
    with pytest.raises(ValueError, match=r"train.lr = 0.5, but the study tuned train.lr \(its "
                       r"best trial: 0.01\); set from_tune or train.lr, not both"):  # fmt: skip
        _tuned(ws, "train.lr=0.5")
    # at the best trial's value it is what from_tune trains anyway
    recipe, _ = _tuned(ws, "train.lr=0.01", "train.warmup_steps=10")
    assert recipe.train.lr == 0.01


def test_the_study_keeping_its_base_recipe_names_keys_without_the_ledger(tmp_path):
    ws = Workspace(tmp_path)
    record = _study(ws)
    record["plan"]["base_recipe"] = load_recipe(TINY).to_dict()  # the whole tree
    rec.write_record(ws, record)
    recipe = load_recipe(TINY, ["train.from_tune=tiny-tune", "train.lr=0.5"])
    with pytest.raises(ValueError, match=r"train.lr = 0.5, but the study tuned"):
        use_tune(recipe, ws)
    recipe = load_recipe(TINY, ["train.from_tune=tiny-tune", "model.d_model=32"])
    with pytest.raises(ValueError, match=r"model.d_model differ"):
        use_tune(recipe, ws)
