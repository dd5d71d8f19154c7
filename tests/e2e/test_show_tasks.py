"""`ledger show` and `ledger compare` of runs with downstream tasks, read at 80 columns
(through a terminal and piped): the task curves with their standard errors however
many tasks there are, evaluations written after the fact marked, the task seconds as a
row within eval, the target line naming task targets with their direction and the
interval rule; the compare line when the loss improved but a task did not, and the
seed groups' spread. The runs are written through the ledger's API (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.test_tables_80 import MODES, WIDTH, ledgerlm_at, readable
from ledgerlm.cli.ui import fmt_seconds
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.compare_tasks import pm, task_metric_names
from report.task_ledger import EVAL_SECONDS, accuracy, bits, task_run

TASKS = ("arith", "code-next-line", "qa-long-name", "story", "syllogisms")


def _metrics(i: int) -> dict[str, float]:
    """Evaluation ``i``: a loss, an exact task, three choice tasks and a bpb task: eight
    task metrics, more than one 80-column table holds."""
    out = {"loss": 2.0 - 0.1 * i, "loss/code": 2.5}
    out |= accuracy("arith", "exact_match", 10 + 10 * i, 100)
    for name in ("code-next-line", "qa-long-name", "syllogisms"):
        out |= accuracy(name, "acc", 30 + 4 * i, 120) | accuracy(name, "acc_norm", 32 + 4 * i, 120)
    return out | bits("story", 1.9 - 0.05 * i, 0.031, 64)


@pytest.fixture(scope="module")
def shown(tmp_path_factory) -> tuple[Path, str, dict]:
    ws = tmp_path_factory.mktemp("show-tasks")
    with Ledger(ws / "ledger.db") as ledger:
        run = task_run(
            ledger,
            "tasks",
            evals=[_metrics(i) for i in range(4)],
            metric="task/arith/exact_match",
            threshold=0.2,
            targets={"task/arith/exact_match": 0.2, "task/story/bpb": 1.9, "code": 3.0},
            confirm_by="interval",
            task_seconds=[dict.fromkeys(TASKS, 0.1 * (i + 1)) for i in range(4)],
            after=[
                (200, accuracy("arith", "exact_match", 21, 100), True),
                (300, accuracy("arith", "exact_match", 31, 100), False),
            ],
        )
        summary = ledger.run_summary(run)
    return ws, run, summary


@MODES
def test_show_prints_every_task_curve_whole_at_80_columns(shown, tty) -> None:
    ws, run, summary = shown
    out = ledgerlm_at("ledger", "show", run, "-w", str(ws), tty=tty)
    metrics = task_metric_names(summary["evaluations"])
    assert len(metrics) == 8
    cells = [
        pm(e["metrics"][k], e["metrics"][f"{k}_stderr"])
        for e in summary["evaluations"]
        for k in metrics
        if k in e["metrics"]
    ]
    assert "0.20±0.04" in cells  # arith at step 200: 20 of 100
    readable(out, cells)
    for name in metrics:  # every header, perhaps broken after its slash
        head, tail = name.removeprefix("task/").split("/")
        assert f"{head}/{tail}" in out or (f"{head}/" in out and tail in out), name
    assert out.count("tasks (value±stderr),") >= 3  # one table per few metrics
    lines = out.splitlines()
    for mark in ("200+", "300*"):  # in every task table, not in the loss table
        marked = [line for line in lines if line.split()[:1] == [mark]]
        assert len(marked) == len(cells_tables(out)) == 3, mark
    joined = " ".join(out.split())
    assert (
        "* scored after the fact in process (ledgerlm eval); + by lm-evaluation-harness "
        "(ledgerlm eval --harness): never confirming the target, never on its bill" in joined
    )


def cells_tables(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip().startswith("tasks (value±stderr)")]


@MODES
def test_show_bills_task_seconds_within_eval_and_names_task_targets(shown, tty) -> None:
    ws, run, summary = shown
    out = ledgerlm_at("ledger", "show", run, "-w", str(ws), tty=tty)
    ttt = summary["time_to_target"]
    total = sum(0.1 * (i + 1) for i in range(4)) * len(TASKS)
    row = next(line for line in out.splitlines() if "of which tasks" in line)
    assert fmt_seconds(total) in row
    eval_row = next(line for line in out.splitlines() if line.split()[:1] == ["eval"])
    assert fmt_seconds(4 * EVAL_SECONDS) in eval_row
    # confirmed at step 300, where arith's interval first clears 0.2 (30 of 100: its
    # lower bound 0.218; 20 of 100: 0.133): three evaluations' task seconds on the bill
    assert ttt["step"] == 300
    if "task_seconds" in ttt:
        assert ttt["task_seconds"] == pytest.approx((0.1 + 0.2 + 0.3) * len(TASKS))
        assert row.split()[-2:] == ["3.0", "s"]
    target = " ".join(out.split()).split("target: ", 1)[1]
    assert target.startswith("task/arith/exact_match >= 0.200 accuracy")
    assert "task/story/bpb <= 1.900" in target and "loss/code <= 3.000" in target
    assert "a task target holds by its 95% interval" in target
    assert all(len(line) <= WIDTH for line in out.splitlines() if "target" in line)


def _pair(ledger: Ledger, name: str, seed: int, loss: float, correct: int) -> str:
    recipe = {"name": name, "train": {"seed": seed, "lr": 1e-3}}
    evals = [{"loss": loss, **accuracy("qa", "acc", correct, 100)}]
    return task_run(ledger, name, recipe, evals=evals)


@MODES
def test_compare_names_the_task_that_did_not_improve_and_the_seed_spread(tmp_path, tty) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger:
        base = _pair(ledger, "base", 0, 1.2, 45)
        runs = [base, _pair(ledger, "s1", 1, 1.1, 41), _pair(ledger, "s2", 2, 1.3, 49)]
    out = ledgerlm_at("ledger", "compare", *runs, "-w", str(tmp_path), tty=tty)
    joined = " ".join(out.split())
    assert "val loss improved (1.1000 vs 1.2000, baseline) but not task/qa/acc 0.41±0.05 vs " \
        "0.45±0.05" in joined  # fmt: skip
    assert joined.count("improved (") == 1  # s2's loss is worse: no line
    assert "seed groups: final metrics over seeds" in out
    row = next(line for line in out.splitlines() if "task/qa/acc" in line and "0.4500" in line)
    assert [c for c in row.split() if c != "│"][-4:] == ["0.4500", "0.0400", "0.4100-0.4900", "3"]
    readable(out)
