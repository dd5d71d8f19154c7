"""The demo-tasks recipe: its task target means something, and (slow) the demo model
confirms it by the far end of its 95% interval."""

import pytest

from ledgerlm.cli.recipes import shipped_recipe
from ledgerlm.config import load_recipe
from ledgerlm.ledger.store import Ledger

from .conftest import ledgerlm


def test_demo_tasks_target_is_a_task_judged_by_its_interval():
    recipe = load_recipe(shipped_recipe("demo-tasks"))
    demo = load_recipe(shipped_recipe("demo"))
    metric, threshold, unit = recipe.eval.target()
    assert metric == "task/arith-bpb/bpb" and unit == "bit/byte"
    assert recipe.eval.confirm_by == "interval"
    # well below what the model scores after 50 updates (3.8 bits per byte, measured)
    assert threshold <= 3.0
    assert {t.builtin for t in recipe.eval.tasks} == {"arith", "code-next-line"}
    assert {t.task_kind for t in recipe.eval.tasks} == {"bpb", "exact", "choice"}
    # the demo's own corpus, model and budget: only the target differs
    for section in ("data", "tokenizer", "pack", "model", "train"):
        assert getattr(recipe, section) == getattr(demo, section), section


@pytest.mark.slow
def test_demo_tasks_confirms_its_task_target(tmp_path):
    recipe = load_recipe(shipped_recipe("demo-tasks"))
    metric, threshold, _ = recipe.eval.target()
    # about 4 minutes on an idle 2-core machine; a loaded one may take three times that
    recipe_path = str(shipped_recipe("demo-tasks"))
    out = ledgerlm("run", recipe_path, "-w", str(tmp_path), timeout=1800).stdout
    assert "target reached at step" in out
    with Ledger(tmp_path / "ledger.db", read_only=True) as ledger:
        (run,) = ledger.list_runs()
        summary = ledger.run_summary(run["id"])
    verdict = summary["time_to_target"]
    assert verdict["reached"] and verdict["metric"] == metric
    confirming = verdict["evaluation"]["metrics"]
    # confirmed by the interval's upper end, which lies above the value itself
    assert confirming[f"{metric}_high"] <= threshold
    assert confirming[metric] < confirming[f"{metric}_high"]
    # every evaluation before it failed the interval rule
    before = [e for e in summary["evaluations"] if e["step"] < verdict["step"]]
    assert all(e["metrics"][f"{metric}_high"] > threshold for e in before)
    # the run stopped there, within its budget, and its tasks' seconds are on the bill
    assert max(e["step"] for e in summary["evaluations"]) == verdict["step"]
    assert verdict["step"] <= recipe.train.max_steps
    assert 0 < verdict["task_seconds"] < verdict["seconds"]
