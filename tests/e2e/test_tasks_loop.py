"""``ledgerlm run`` of the tiny recipe with downstream tasks: every evaluation in the ledger
holds their metrics, a task target confirms the run, the bill holds the tasks' seconds
as their own row within eval, and a bad task file stops the run in one line before its
ledger row; a resumed run scores them as the uninterrupted run."""

from __future__ import annotations

import hashlib
import json

import pytest

from kill_at import KillAt, Killed
from ledgerlm.config import load_recipe
from ledgerlm.lab.resume import resume_run
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger.store import Ledger
from ledgerlm.ledger.target import time_to_target
from ledgerlm.workspace import Workspace

from .conftest import ledgerlm
from .tasks_ranks import tasks_recipe

# pick's accuracy in this run: 0.25 at step 10 (its interval's lower bound 0.12), 0.54
# at step 20 (0.35): the threshold alone would confirm at step 10, the interval at 20
TARGET = 'metric = "task/pick/acc"\ntargets = {"task/pick/acc" = 0.2}\nconfirm_by = "interval"\n'
STEPS = ["--set", "train.max_steps=40", "--set", "eval.every_steps=10"]


@pytest.mark.slow
def test_a_task_target_confirms_the_run_and_its_seconds_are_on_the_bill(
    tiny_workspace_copy, tmp_path
):
    ws, recipe = tiny_workspace_copy, tasks_recipe(tmp_path, TARGET)
    ledgerlm("run", str(recipe), "--workspace", str(ws), *STEPS)
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        run = ledger.list_runs()[0]  # newest first: this test's
        summary = ledger.run_summary(run["id"])
    verdict, evals = summary["time_to_target"], summary["evaluations"]
    assert verdict["metric"] == "task/pick/acc" and verdict["reached"]
    # the first evaluation's accuracy at the threshold, not its interval; the second's
    # interval too: confirmed there, and the run stopped
    assert [e["step"] for e in evals] == [10, 20] and verdict["step"] == 20
    first, second = (e["metrics"] for e in evals)
    assert first["task/pick/acc"] >= 0.2 > first["task/pick/acc_low"]
    assert second["task/pick/acc_low"] >= 0.2
    by_value = time_to_target(summary["phases"], evals, "task/pick/acc", 0.2)
    assert by_value.step == 10  # what the interval refused
    for e in evals:
        m = e["metrics"]
        assert m["task/pick/items"] == 24 and m["task/sums/items"] == 12
        assert m["task/prose/items"] == 16
        assert {"task/pick/acc_low", "task/pick/acc_norm", "task/sums/exact_match"} <= m.keys()
    evals_phases = [p for p in summary["phases"] if "task_seconds" in p["detail"]]
    assert [p["id"] for p in evals_phases] == [e["phase_id"] for e in evals]
    spent = sum(s for p in evals_phases for s in p["detail"]["task_seconds"].values())
    # the same seconds summed in another order: equal to the last bit or two
    assert verdict["task_seconds"] == pytest.approx(spent, rel=1e-12) and spent > 0
    assert verdict["task_seconds"] < verdict["by_phase"]["eval"]
    (event,) = [e for e in summary["events"] if e["kind"] == "tasks"]
    found = {t["name"]: t for t in json.loads(event["message"])}
    for name, t in found.items():
        digest = hashlib.sha256((tmp_path / "tasks" / f"{name}.jsonl").read_bytes()).hexdigest()
        assert t["sha256"] == digest
    assert {n: t["items"] for n, t in found.items()} == {"pick": 24, "sums": 12, "prose": 16}


def test_a_bad_task_file_stops_the_run_in_one_line_before_its_ledger_row(
    tiny_workspace_copy, tmp_path
):
    ws, recipe = tiny_workspace_copy, tasks_recipe(tmp_path)
    bad = tmp_path / "tasks" / "pick.jsonl"
    lines = bad.read_text().splitlines()
    lines[2] = '{"context": "x", "choices": ["a"], "gold": 3}'
    bad.write_text("\n".join(lines) + "\n")
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        before = len(ledger.list_runs())
    proc = ledgerlm("run", str(recipe), "--workspace", str(ws), *STEPS, check=False)
    assert proc.returncode != 0
    (line,) = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert f"{bad}:3:" in line and "gold" in line
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        assert len(ledger.list_runs()) == before


SHORT = ["train.max_steps=8", "eval.every_steps=4", "train.threads=1"]


def test_a_resumed_run_scores_the_tasks_as_the_uninterrupted_run(tmp_path):
    """Killed at step 6 (checkpointed at 4), resumed: the resumed process resolves the
    tasks again (a second tasks event, the same files) and its evaluations hold the
    task metrics the uninterrupted run's hold, at every step."""
    recipe = tasks_recipe(tmp_path)
    whole = run_recipe(load_recipe(recipe, SHORT), Workspace(tmp_path / "whole"))
    ws = Workspace(tmp_path / "killed")
    with pytest.raises(Killed):
        killed = load_recipe(recipe, [*SHORT, "train.checkpoint_every=4"])
        run_recipe(killed, ws, callbacks=[KillAt(6)])
    resumed = resume_run(ws, "latest").summary
    got, want = resumed["evaluations"], whole.summary["evaluations"]
    assert [e["step"] for e in got] == [e["step"] for e in want] == [4, 8]
    for a, b in zip(got, want, strict=True):
        assert a["snapshot"] == b["snapshot"]
        tasks = {k: v for k, v in b["metrics"].items() if k.startswith("task/")}
        assert len(tasks) == 19 and {k: a["metrics"][k] for k in tasks} == tasks
    found = [json.loads(e["message"]) for e in resumed["events"] if e["kind"] == "tasks"]
    assert len(found) == 2 and found[0] == found[1]


def test_an_exact_task_that_leaves_no_room_for_its_context_stops_before_the_ledger_row(
    tmp_path,
):
    """max_new_tokens at pack.seq_len (64): refused in one line before the run's row."""
    recipe = tasks_recipe(tmp_path, names=("sums",))
    recipe.write_text(recipe.read_text().replace("max_new_tokens = 4", "max_new_tokens = 64"))
    ws = Workspace(tmp_path / "ws")
    line = "eval.tasks 'sums': max_new_tokens 64 leaves no room for a context in pack.seq_len 64"
    with pytest.raises(ValueError, match=f"^{line}$"):
        run_recipe(load_recipe(recipe, SHORT), ws)
    assert not ws.ledger_path.exists() or not Ledger(ws.ledger_path).list_runs()


def test_a_continuation_longer_than_seq_len_stops_the_run_before_training(tmp_path):
    """A bits-per-byte answer of more than 64 tokens: one line naming the file and the
    record's line, at the evaluation phase that resolves the tasks; nothing trained."""
    recipe = tasks_recipe(tmp_path, names=("prose",))
    path = tmp_path / "tasks" / "prose.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = json.dumps({"context": "the data", "answer": " ".join(["model"] * 200)}) + "\n"
    path.write_text("".join(lines))
    ws = Workspace(tmp_path / "ws")
    with pytest.raises(ValueError, match=rf"^{path}:4: a continuation of \d+ tokens does not fit"):
        run_recipe(load_recipe(recipe, SHORT), ws)
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        (run,) = ledger.list_runs()
        summary = ledger.run_summary(run["id"])
    assert run["status"] == "failed" and summary["evaluations"] == []
    assert "train" not in {p["kind"] for p in summary["phases"]}
