"""``ledgerlm eval`` as a user runs it on the tiny run: one table of the task metrics at
80 columns, the evaluation in the ledger bound to an ``eval_after`` phase, the run's
verdict unchanged; every refusal one line, with nothing written (the shared workspace's
digest says so); ``--harness`` without lm-evaluation-harness names its extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import ledgerlm, ledgerlm_without
from ledgerlm.ledger.store import Ledger

WORDS = ["def", "return", "self", "import", "class", "for", "if", "in", "not", "None"]


def _tasks_file(folder: Path) -> Path:
    """A choice and a bpb task on code-like records, as a TOML file of [[tasks]]."""
    import random

    rng = random.Random(1)
    choice, bpb = folder / "choice.jsonl", folder / "bpb.jsonl"
    with choice.open("w") as c, bpb.open("w") as b:
        for i in range(15):
            context = " ".join(rng.choice(WORDS) for _ in range(4)) + ["", " ", "\n"][i % 3]
            options = [" ".join(rng.sample(WORDS, 2)) for _ in range(3)]
            c.write(json.dumps({"context": context, "choices": options, "gold": i % 3}) + "\n")
            b.write(json.dumps({"context": context, "answer": options[0]}) + "\n")
    toml = folder / "tasks.toml"
    toml.write_text(
        f'[[tasks]]\nname = "next-words"\npath = "{choice}"\nkind = "choice"\n\n'
        f'[[tasks]]\nname = "words-bpb"\npath = "{bpb}"\nkind = "bpb"\n'
    )
    return toml


def _eval(*args: str, columns: int = 80) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("ledgerlm")
    env = {**os.environ, "COLUMNS": str(columns), "LEDGERLM_PROGRESS_SECONDS": "0"}
    return subprocess.run(
        [str(exe), "eval", *args], capture_output=True, text=True, timeout=600, env=env
    )


def _summary(ws: Path, run_id: str) -> dict:
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        return ledger.run_summary(run_id)


def _one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_eval_prints_one_table_and_writes_the_evaluation(
    tiny_workspace_copy, tiny_run_id, tmp_path
):
    ws = tiny_workspace_copy
    before = _summary(ws, tiny_run_id)
    proc = _eval(tiny_run_id, "--tasks", str(_tasks_file(tmp_path)), "-w", str(ws))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, proc.stdout
    rows = {
        line.split()[0]: line
        for line in lines
        if line.split()[:1] in (["next-words"], ["words-bpb"])
    }
    assert set(rows) == {"next-words", "words-bpb"}
    assert " acc " in rows["next-words"] and " bpb " in rows["words-bpb"]
    assert any("acc_norm" in line.split() for line in lines)  # the task's second row

    after = _summary(ws, tiny_run_id)
    (phase,) = [p for p in after["phases"] if p["kind"] == "eval_after"]
    (ev,) = [e for e in after["evaluations"] if e["phase_id"] == phase["id"]]
    last = before["evaluations"][-1]
    assert (ev["step"], ev["snapshot"]) == (last["step"], last["snapshot"])
    assert ev["metrics"]["task/next-words/items"] == 15
    for key in ("task/next-words/acc", "task/next-words/acc_norm", "task/words-bpb/bpb"):
        assert f"{ev['metrics'][key]:.4f}" in proc.stdout, key
    assert f"evaluation {ev['id']} in the ledger" in " ".join(lines)
    assert after["time_to_target"] == before["time_to_target"]
    assert after["run"]["status"] == before["run"]["status"]
    assert set(phase["detail"]["task_seconds"]) == {"next-words", "words-bpb"}


def test_refusals_are_one_line_and_write_nothing(tiny_workspace, tiny_run_id, tmp_path):
    ws = str(tiny_workspace)
    _one_line(_eval(tiny_run_id, "-w", ws), "has no eval.tasks", "(--tasks)")
    tasks = str(_tasks_file(tmp_path))
    _one_line(
        _eval(tiny_run_id, "--tasks", tasks, "--step", "3", "-w", ws),
        "--step 3: run",
        "keeps one checkpoint, its latest, at step",
    )
    _one_line(_eval(tiny_run_id, "--tasks", "arith", "-w", ws), "--tasks 'arith': not a file")


def test_harness_without_lm_eval_names_its_extra(tiny_workspace, tiny_run_id, tmp_path):
    tasks = str(_tasks_file(tmp_path))
    args = ("eval", tiny_run_id, "--tasks", tasks, "--harness", "-w", str(tiny_workspace))
    proc = ledgerlm_without(("lm_eval",), tmp_path, *args)
    _one_line(proc, "ledgerlm eval --harness needs the lm-eval package", "'ledgerlm[lmeval]'")


@pytest.mark.slow
def test_harness_results_go_into_the_ledger(tiny_workspace_copy, tiny_run_id, tmp_path):
    """The same tasks in process and with the harness: two evaluations of one snapshot,
    the harness's in an eval_after phase saying so, their figures equal."""
    pytest.importorskip(
        "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'ledgerlm[lmeval]'"
    )
    ws = str(tiny_workspace_copy)
    tasks = str(_tasks_file(tmp_path))
    ledgerlm("eval", tiny_run_id, "--tasks", tasks, "-w", ws)
    ledgerlm("eval", tiny_run_id, "--tasks", tasks, "--harness", "-w", ws)
    s = _summary(tiny_workspace_copy, tiny_run_id)
    after = {p["id"]: p for p in s["phases"] if p["kind"] == "eval_after"}
    ours, theirs = [e for e in s["evaluations"] if e["phase_id"] in after]
    assert [after[e["phase_id"]]["detail"]["harness"] for e in (ours, theirs)] == [False, True]
    assert ours["snapshot"] == theirs["snapshot"]
    assert theirs["metrics"] == pytest.approx(ours["metrics"], rel=1e-5)
    assert theirs["metrics"]["task/next-words/acc"] == ours["metrics"]["task/next-words/acc"]
