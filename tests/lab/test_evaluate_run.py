"""``evaluate_run``: a finished run's checkpoint scored after the fact, in process, and
written into the ledger as an evaluation of that snapshot bound to an ``eval_after``
phase. The run scores the same tasks in its own loop, so the evaluation after the fact
must give the loop's figures at the checkpoint's step, on the same weights digest;
the run's verdict, status and bill do not move; every refusal writes nothing."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
from contextlib import contextmanager
from pathlib import Path

import pytest

from ledgerlm.config import load_recipe, recipe_from_dict
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.evaluate_run import evaluate_run, read_tasks_file
from ledgerlm.lab.run import run_recipe
from ledgerlm.lab.skeleton import run_lock
from ledgerlm.ledger.coverage import phase_coverage
from ledgerlm.ledger.store import Ledger, LedgerBusyError, LedgerError
from ledgerlm.workspace import Workspace

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
# confirmed at the first evaluation (step 4: any loss under 7 nat/token), where it stops
BASE = ["train.max_steps=8", "eval.every_steps=4", "eval.target_loss=7.0", "train.threads=1"]
WORDS = ["def", "return", "self", "import", "class", "for", "if", "in", "not", "None", "print"]


def _records(kind: str, n: int, seed: int) -> list[dict]:
    """Code-like records whose contexts end in spaces, a newline or nothing."""
    import random

    rng = random.Random(seed)
    ends = ["", " ", "  ", "\n", "(", ":"]
    out = []
    for i in range(n):
        context = " ".join(rng.choice(WORDS) for _ in range(4)) + ends[i % len(ends)]
        if kind == "choice":
            choices = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in "abc"]
            out.append({"context": context, "choices": choices, "gold": rng.randrange(3)})
        else:
            out.append({"context": context, "answer": rng.choice(WORDS)})
    return out


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny run whose loop scores a choice, a bpb and an exact task."""
    root = tmp_path_factory.mktemp("evaluate-run")
    files = {k: _write(root / f"{k}.jsonl", _records(k, 12, i)) for i, k in enumerate(TASKS)}
    tree = load_recipe(TINY, BASE).to_dict()
    tree["eval"]["tasks"] = [
        {"name": f"t-{k}", "path": str(files[k]), "kind": k, "max_new_tokens": 3} for k in TASKS
    ]
    ws = Workspace(root / "ws")
    result = run_recipe(recipe_from_dict(tree), ws)
    return root, result.run_id


TASKS = ("choice", "bpb", "exact")


@pytest.fixture
def ws(made, tmp_path) -> tuple[Workspace, str]:
    """A copy of the run's workspace, for a test that writes to its ledger."""
    root, run_id = made
    shutil.copytree(root / "ws", tmp_path / "ws")
    return Workspace(tmp_path / "ws"), run_id


def _summary(ws: Workspace, run_id: str) -> dict:
    with Ledger(ws.ledger_path, read_only=True) as ledger:
        return ledger.run_summary(run_id)


def _rows(ws: Workspace) -> tuple[int, int]:
    db = sqlite3.connect(ws.ledger_path)
    try:
        return tuple(
            db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("evaluations", "phases")
        )
    finally:
        db.close()


def test_in_process_gives_the_loops_figures_on_the_same_snapshot(ws):
    ws, run_id = ws
    before = _summary(ws, run_id)
    last = before["evaluations"][-1]
    result = evaluate_run(ws, run_id)

    assert (result.step, result.snapshot) == (last["step"], last["snapshot"])
    assert result.loop_snapshot is True and not result.harness
    assert result.tasks == [f"t-{k}" for k in TASKS]
    task_keys = {k: v for k, v in last["metrics"].items() if k.startswith("task/")}
    assert set(result.metrics) == set(task_keys)
    assert result.metrics == pytest.approx(task_keys, rel=1e-6, abs=1e-9, nan_ok=True)

    after = _summary(ws, run_id)
    (phase,) = [p for p in after["phases"] if p["kind"] == "eval_after"]
    (ev,) = [e for e in after["evaluations"] if e["phase_id"] == phase["id"]]
    assert ev["id"] == result.evaluation_id and ev["snapshot"] == last["snapshot"]
    assert (ev["step"], ev["tokens"], ev["targets"], ev["updates"]) == (
        last["step"],
        last["tokens"],
        last["targets"],
        last["updates"],
    )
    assert ev["metrics"] == pytest.approx(result.metrics, nan_ok=True)
    detail = phase["detail"]
    assert detail["snapshot_step"] == last["step"] and detail["harness"] is False
    assert detail["tasks"] == result.tasks and set(detail["task_seconds"]) == set(result.tasks)
    (recorded,) = [json.loads(e["message"]) for e in before["events"] if e["kind"] == "tasks"]
    assert [f["sha256"] for f in detail["task_files"]] == [r["sha256"] for r in recorded]
    assert phase["seconds"] == pytest.approx(result.seconds)
    assert 0 < detail["device_seconds"] <= phase["seconds"]

    # the run's verdict, status and what its bill holds do not move
    assert after["run"]["status"] == before["run"]["status"] == "reached"
    assert after["time_to_target"] == before["time_to_target"]
    # the wait between the run's end and this evaluation is no gap of the run
    cov0, cov1 = before["coverage"], after["coverage"]
    assert cov1["uncovered_seconds"] == pytest.approx(cov0["uncovered_seconds"], abs=1e-6)
    assert cov1["interrupted_seconds"] == cov0["interrupted_seconds"]
    assert cov1["idle_seconds"] > 0 and cov0["idle_seconds"] == 0


def test_named_tasks_a_tasks_file_and_a_limit(ws, tmp_path):
    ws, run_id = ws
    extra = _write(tmp_path / "more.jsonl", _records("choice", 9, 7))
    toml = tmp_path / "more.toml"
    toml.write_text(f'[[tasks]]\nname = "more"\npath = "{extra}"\nkind = "choice"\nfew_shot = 0\n')
    result = evaluate_run(ws, run_id, tasks=["t-bpb", str(toml)], limit=5)
    assert result.tasks == ["t-bpb", "more"]
    assert result.metrics["task/t-bpb/items"] == result.metrics["task/more/items"] == 5
    assert {k.split("/")[1] for k in result.metrics} == {"t-bpb", "more"}
    assert 0 <= result.metrics["task/more/acc"] <= 1


def test_refusals_write_nothing(ws, tmp_path):
    ws, run_id = ws
    before = _rows(ws)
    step = _summary(ws, run_id)["evaluations"][-1]["step"]
    with pytest.raises(
        ArgumentError,
        match=f"step 3: run {run_id} keeps one checkpoint, its latest, at step {step}",
    ):
        evaluate_run(ws, run_id, step=3)
    with pytest.raises(
        ArgumentError,
        match=r"tasks 'nope': not a file, nor a task of run .*t-choice, t-bpb, t-exact",
    ):
        evaluate_run(ws, run_id, tasks=["nope"])
    with pytest.raises(ArgumentError, match="task t-bpb given more than once"):
        evaluate_run(ws, run_id, tasks=["t-bpb", "t-bpb"])
    with pytest.raises(ArgumentError, match="limit 0: must be at least 1"):
        evaluate_run(ws, run_id, limit=0)
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tasks]]\nname = "x"\npath = "x.jsonl"\nkind = "choice"\nshots = 2\n')
    with pytest.raises(ValueError, match=f"{bad}: unknown key 'tasks.0.shots'"):
        evaluate_run(ws, run_id, tasks=[str(bad)])
    missing = tmp_path / "missing.jsonl"
    bad.write_text(f'[[tasks]]\nname = "x"\npath = "{missing}"\nkind = "choice"\n')
    with pytest.raises(ValueError, match=f"{missing}: cannot read the task file"):
        evaluate_run(ws, run_id, tasks=[str(bad)])
    # a run a live process trains: its status running and its lock held
    with Ledger(ws.ledger_path) as ledger:
        ledger.finish_run(run_id, "running")
    with run_lock(ws.run_dir(run_id)), pytest.raises(LedgerError, match="is being trained"):
        evaluate_run(ws, run_id)
    with Ledger(ws.ledger_path) as ledger:
        ledger.finish_run(run_id, "reached")
    shutil.rmtree(ws.run_dir(run_id) / "checkpoint")
    with pytest.raises(LedgerError, match=f"run {run_id} has no checkpoint to evaluate"):
        evaluate_run(ws, run_id)
    assert _rows(ws) == before


def test_a_checkpoint_that_is_not_the_loops_snapshot_is_refused(ws):
    """The loop's digest at the step altered: the checkpoint no longer matches what the
    run evaluated there; it is refused before anything is written."""
    ws, run_id = ws
    last = _summary(ws, run_id)["evaluations"][-1]
    db = sqlite3.connect(ws.ledger_path)
    with db:
        db.execute(
            "UPDATE evaluations SET snapshot = 'feedfacefeedface' WHERE id = ?", (last["id"],)
        )
    db.close()
    before = _rows(ws)
    with pytest.raises(
        LedgerError, match=f"digest {last['snapshot']}.*step {last['step']} \\(feedfacefeedface\\)"
    ):
        evaluate_run(ws, run_id)
    assert _rows(ws) == before  # no evaluation, and no eval_after phase either


def test_a_limit_only_lowers_a_tasks_own_limit(ws, tmp_path):
    """``limit`` 5 on a task of limit 3 scores its 3 items, not 5; on a task of no limit
    of its own, 5."""
    ws, run_id = ws
    extra = _write(tmp_path / "more.jsonl", _records("choice", 9, 7))
    toml = tmp_path / "more.toml"
    toml.write_text(f'[[tasks]]\nname = "more"\npath = "{extra}"\nkind = "choice"\nlimit = 3\n')
    result = evaluate_run(ws, run_id, tasks=["t-bpb", str(toml)], limit=5)
    assert result.metrics["task/more/items"] == 3
    assert result.metrics["task/t-bpb/items"] == 5


class _Interrupted:
    """A progress display whose first advance is a Ctrl-C, in the middle of scoring."""

    @contextmanager
    def task(self, description, total=None):
        yield self

    def advance(self, n=1, **fields):
        raise KeyboardInterrupt

    def note(self, line):
        pass


def test_an_interrupted_scoring_leaves_the_ledger_as_it_was(ws):
    ws, run_id = ws
    before = _rows(ws)
    with pytest.raises(KeyboardInterrupt):
        evaluate_run(ws, run_id, progress=_Interrupted())
    assert _rows(ws) == before  # no eval_after phase, open or closed


def test_an_evaluation_that_cannot_be_written_leaves_no_phase_behind(ws, monkeypatch):
    """The eval_after phase and its evaluation are one transaction: the evaluation's
    insert failing (a ledger held past its timeout) takes the phase back with it."""
    ws, run_id = ws
    before = _rows(ws)

    def busy(self, *args, **kwargs):
        raise LedgerBusyError(f"{ws.ledger_path}: database is locked")

    monkeypatch.setattr(Ledger, "add_evaluation", busy)
    with pytest.raises(LedgerBusyError):
        evaluate_run(ws, run_id, tasks=["t-bpb"])
    assert _rows(ws) == before


def test_a_save_killed_between_its_renames_is_scored_from_the_checkpoint_it_kept(ws):
    """The checkpoint moved aside as a save does before renaming the new one in, and
    the save killed there: the run resumes from it, and ledgerlm eval scores it too."""
    ws, run_id = ws
    folder = ws.run_dir(run_id) / "checkpoint"
    folder.rename(folder.parent / ".checkpoint.previous")
    result = evaluate_run(ws, run_id, tasks=["t-bpb"])
    assert result.loop_snapshot is True  # the weights the loop scored at that step


def test_a_task_file_changed_since_the_run_started_is_refused(ws, made, tmp_path):
    """The run's own task file rewritten (its items reordered), and a tasks file whose
    task takes one of the run's task names for another file: both would score other
    items under the run's metric keys; each is one line naming the file, and nothing
    is written."""
    ws, run_id = ws
    before = _rows(ws)
    path = made[0] / "choice.jsonl"
    was = path.read_bytes()
    then = hashlib.sha256(was).hexdigest()
    try:
        lines = was.decode().splitlines(keepends=True)
        path.write_text("".join([lines[1], lines[0], *lines[2:]]))
        now = hashlib.sha256(path.read_bytes()).hexdigest()
        line = f"{path}: changed since run {run_id} started (sha256 {then[:12]}... then, "
        line += f"{now[:12]}... now)"
        with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
            evaluate_run(ws, run_id)
        with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
            evaluate_run(ws, run_id, tasks=["t-choice"])
    finally:
        path.write_bytes(was)
    other = _write(tmp_path / "other.jsonl", _records("choice", 12, 99))
    toml = tmp_path / "same-name.toml"
    toml.write_text(f'[[tasks]]\nname = "t-choice"\npath = "{other}"\nkind = "choice"\n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(other))}: changed since run"):
        evaluate_run(ws, run_id, tasks=[str(toml)])
    # the run's own file under its name, read with a lower limit: other items too
    fewer = f'[[tasks]]\nname = "t-choice"\npath = "{path}"\nkind = "choice"\nlimit = 3\n'
    toml.write_text(fewer)
    line = f"{path}: task 't-choice' gives 3 items, where run {run_id} scored 12 of the same"
    with pytest.raises(ValueError, match=f"^{re.escape(line)}"):
        evaluate_run(ws, run_id, tasks=[str(toml)])
    assert _rows(ws) == before


def test_a_table_of_a_run_task_s_name_scored_otherwise_is_refused(ws, made, tmp_path):
    """The run's own file under its name, but with few-shot examples, another delimiter
    or another generation length: other prompts or other scores under the run's metric
    keys; one line naming what differs, and nothing written. Its path and limit may
    differ (the sha256 and the item count say whether it is the same items)."""
    ws, run_id = ws
    before = _rows(ws)
    choice, exact = made[0] / "choice.jsonl", made[0] / "exact.jsonl"
    toml = tmp_path / "same-name.toml"
    for name, table, differs in [
        ("t-choice", f'name = "t-choice"\npath = "{choice}"\nkind = "choice"\ndelimiter = ""\n',
         "delimiter = '' (the run's: ' ')"),
        ("t-exact", f'name = "t-exact"\npath = "{exact}"\nkind = "exact"\n',
         "max_new_tokens = 16 (the run's: 3)"),
        ("t-exact", f'name = "t-exact"\npath = "{exact}"\nkind = "bpb"\nmax_new_tokens = 3\n',
         "kind = 'bpb' (the run's: 'exact')"),
    ]:  # fmt: skip
        toml.write_text("[[tasks]]\n" + table)
        line = f"{toml}: task {name!r} is one of run {run_id}'s tasks, "
        line += f"scored under its metric keys, but is not scored as the run scores it: {differs}"
        with pytest.raises(ValueError, match=f"^{re.escape(line)}; give it another name$"):
            evaluate_run(ws, run_id, tasks=[str(toml)])
    assert _rows(ws) == before
    # the same scoring from another path to the same file, and a limit of its own
    toml.write_text(
        f'[[tasks]]\nname = "t-exact"\npath = "{made[0] / "." / "exact.jsonl"}"\n'
        'kind = "exact"\nmax_new_tokens = 3\nlimit = 12\n'
    )
    assert evaluate_run(ws, run_id, tasks=[str(toml)]).metrics["task/t-exact/items"] == 12


def test_a_continuation_that_does_not_fit_is_refused_before_the_model_loads(ws, tmp_path):
    ws, run_id = ws
    before = _rows(ws)
    long = _write(tmp_path / "long.jsonl", [{"context": "def", "answer": " x" * 200}])
    toml = tmp_path / "long.toml"
    toml.write_text(f'[[tasks]]\nname = "long"\npath = "{long}"\nkind = "bpb"\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(long))}:1: a continuation of \d+"):
        evaluate_run(ws, run_id, tasks=[str(toml)])
    assert _rows(ws) == before


def test_the_wait_before_an_eval_after_phase_is_idle_not_uncovered():
    def phase(kind, start, end, **detail):
        return {"kind": kind, "started_at": start, "ended_at": end, "detail": detail}

    run = [phase("train", 0.0, 10.0), phase("eval", 10.5, 11.0)]
    later = [*run, phase("eval_after", 100.0, 103.0), phase("restore", 110.0, 111.0, resume=True)]
    cov = phase_coverage(0.0, later)
    assert cov["uncovered_seconds"] == pytest.approx(0.5)  # between train and eval
    assert cov["idle_seconds"] == pytest.approx(89.0)  # from the run's end to eval_after
    assert cov["interrupted_seconds"] == pytest.approx(7.0)
    assert cov["wall_seconds"] == 111.0 and cov["phase_seconds"] == pytest.approx(14.5)
    assert phase_coverage(0.0, run)["idle_seconds"] == 0.0


def test_a_tasks_file_of_no_tables_is_one_line(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match=f"^{empty}: no \\[\\[tasks\\]\\] tables$"):
        read_tasks_file(empty)
    empty.write_text("[[tasks]]\nname = 'x'\n")
    with pytest.raises(
        ValueError, match=f"^{empty}: tasks.0: .*give path or builtin, exactly one$"
    ):
        read_tasks_file(empty)


def test_a_tasks_file_that_is_not_toml_or_not_there_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tasks]\n")
    with pytest.raises(ValueError, match=f"^{bad}: not valid TOML: "):
        read_tasks_file(bad)
    with pytest.raises(ValueError, match=f"^{tmp_path}: cannot read the tasks file: "):
        read_tasks_file(tmp_path)  # a folder


def test_a_bf16_run_is_scored_with_its_own_numerics(tmp_path):
    """Under train.precision = "bf16" the loop scores its tasks under bf16 autocast; the
    evaluation after the fact on the same snapshot does too, and gives its figures
    (float32 forwards would not: they move every log-likelihood)."""
    tree = load_recipe(TINY, [*BASE, 'train.precision="bf16"', "train.max_steps=4"]).to_dict()
    tree["eval"]["tasks"] = [
        {"name": k, "path": str(_write(tmp_path / f"{k}.jsonl", _records(k, 12, 3))), "kind": k}
        for k in ("choice", "bpb")
    ]
    ws = Workspace(tmp_path / "ws")
    run_id = run_recipe(recipe_from_dict(tree), ws).run_id
    last = _summary(ws, run_id)["evaluations"][-1]
    result = evaluate_run(ws, run_id)
    assert result.snapshot == last["snapshot"]
    loop = {k: v for k, v in last["metrics"].items() if k.startswith("task/")}
    assert result.metrics == pytest.approx(loop, rel=1e-6, abs=1e-9, nan_ok=True)
