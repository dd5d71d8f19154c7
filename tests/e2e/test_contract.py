"""The target contract through the CLI: it is in the ledger before training, and the
ledger's verdict applies the same confirmation rule that stopped the run."""

import itertools
import json
from pathlib import Path

from ledgerlm.ledger.store import Ledger

from .conftest import TINY, ledgerlm


def _show(ws, run):
    return json.loads(ledgerlm("ledger", "show", run, "--json", "-w", str(ws)).stdout)


def _ids(ws) -> set[str]:
    with Ledger(Path(ws) / "ledger.db", read_only=True) as ledger:
        return {r["id"] for r in ledger.list_runs()}


def test_domain_metric_with_two_confirming_evaluations(tiny_workspace_copy, tiny_run_id):
    ws = str(tiny_workspace_copy)  # its data and tokens versions, and a run of its own
    contract = ["--set", "eval.metric=loss/math", "--set", "eval.confirm=2"]
    contract += ["--set", "eval.target_loss=4.5", "--set", "eval.every_steps=10"]
    contract += ["--set", "eval.budget_tokens=400000"]
    proc = ledgerlm("run", str(TINY), "-w", ws, *contract)
    assert "at 2 consecutive evaluations" in proc.stdout and "budget 400,000 tokens" in proc.stdout
    (run,) = _ids(ws) - {tiny_run_id}
    s = _show(ws, run)
    events = {e["kind"]: e for e in s["events"]}
    stored = json.loads(events["target_contract"]["message"])
    assert stored["metric"] == "loss/math" and stored["confirm"] == 2
    assert stored["budget_tokens"] == 400_000 and stored["every_steps"] == 10
    assert s["run"]["meta"]["contract"]["confirm"] == 2

    evals = [(e["step"], e["metrics"]["loss/math"]) for e in s["evaluations"]]
    ttt = s["time_to_target"]
    assert ttt["reached"] and ttt["metric"] == "loss/math"
    confirmed = next(b for (a, va), (b, vb) in itertools.pairwise(evals) if va <= 4.5 and vb <= 4.5)
    assert ttt["step"] == confirmed == events["train_end"]["step"]
    assert events["train_end"]["message"] == "target confirmed"


def test_a_metric_for_a_domain_the_data_lacks_is_refused(tmp_path):
    proc = ledgerlm(
        "run", str(TINY), "-w", str(tmp_path), "--set", "eval.metric=loss/poetry", check=False
    )
    assert proc.returncode == 2
    assert "eval.metric = 'loss/poetry'" in proc.stderr and "code, docs, math" in proc.stderr


def test_a_test_split_is_scored_once_and_is_the_final_figure(tmp_path):
    ws = str(tmp_path)
    args = ["--set", "data.test_fraction=0.1", "--set", "train.max_steps=20"]
    proc = ledgerlm("run", str(TINY), "-w", ws, *args)
    assert "test set, final weights at step 20: loss " in proc.stdout  # not reached
    ledgerlm("run", str(TINY), "-w", ws, *args, "--set", "train.seed=1")
    runs = json.loads(ledgerlm("ledger", "list", "--json", "-w", ws).stdout)
    a, b = (r["id"] for r in reversed(runs))
    s = _show(tmp_path, b)
    tests = [e for e in s["events"] if e["kind"] == "test_evaluation"]
    assert len(tests) == 1  # once
    found = json.loads(tests[0]["message"])
    assert found["step"] == 20 and found["snapshot"] == s["evaluations"][-1]["snapshot"]
    assert set(found["metrics"]) >= {"test/loss", "test/loss/code"}
    # Validation rows carry no test metric: the test set never decides the target.
    assert not any(k.startswith("test") for e in s["evaluations"] for k in e["metrics"])
    compared = json.loads(ledgerlm("ledger", "compare", a, b, "--json", "-w", ws).stdout)
    assert compared["final_figure"] == (
        "final figure: test metrics measured for 2 of 2 runs (see each run's test field)"
    )
    assert compared["comparisons"][0]["final"].startswith("final figure: test/loss ")
