"""The SQLite ledger: real rows in a real file under tmp_path."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerlm.ledger import Ledger, LedgerError, time_to_target

THRESHOLD = 3.0


def _loss(step: int, cross_step: int) -> float:
    """A straight loss curve that reaches THRESHOLD exactly at ``cross_step``."""
    return THRESHOLD + (cross_step - step) / 1000


def _seed_run(
    ledger: Ledger,
    name: str,
    *,
    steps: int,
    sec_per_step: float,
    cross_step: int,
    prep: float = 0.0,
) -> str:
    """SPEC T4: eval every 500 steps, each eval phase takes 20 s."""
    run = ledger.create_run(
        name, {"seed": 0}, target_metric="val_loss", target_value=THRESHOLD, eval_every=500
    )
    if prep:
        ledger.record_phase(run, "prep", prep)
    for end in range(500, steps + 1, 500):
        ledger.record_phase(run, "train", 500 * sec_per_step, step_start=end - 500, step_end=end)
        eval_id = ledger.record_phase(run, "eval", 20.0, step_start=end, step_end=end)
        ledger.add_evaluation(
            run,
            step=end,
            tokens=end * 4096,
            targets=end * 4096,
            updates=end,
            metrics={"val_loss": _loss(end, cross_step)},
            snapshot=f"step-{end}",
            phase_id=eval_id,
        )
    ledger.finish_run(run, "running")
    return run


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger(tmp_path / "nested" / "ledger.sqlite") as led:
        yield led


@pytest.mark.parametrize(
    ("steps", "sec_per_step", "cross", "prep", "expected_s", "expected_step"),
    [
        (2000, 1.0, 2000, 0.0, 2080.0, 2000),  # A
        (2000, 0.6, 2000, 0.0, 1280.0, 2000),  # B
        (4000, 0.8, 4000, 0.0, 3360.0, 4000),  # C
        (2000, 0.9, 1200, 300.0, 1710.0, 1500),  # D: crosses at 1200, confirmed at 1500
    ],
    ids=["A", "B", "C", "D"],
)
def test_seed_example(
    ledger: Ledger,
    steps: int,
    sec_per_step: float,
    cross: int,
    prep: float,
    expected_s: float,
    expected_step: int,
) -> None:
    run = _seed_run(
        ledger, "seed", steps=steps, sec_per_step=sec_per_step, cross_step=cross, prep=prep
    )
    ttt = ledger.run_summary(run)["time_to_target"]
    assert ttt["reached"] is True
    assert ttt["step"] == expected_step
    assert ttt["seconds"] == pytest.approx(expected_s)
    assert ttt["evaluation"]["snapshot"] == f"step-{expected_step}"


def test_seed_example_d_by_phase(ledger: Ledger) -> None:
    run = _seed_run(ledger, "d", steps=2000, sec_per_step=0.9, cross_step=1200, prep=300.0)
    summary = ledger.run_summary(run)
    assert summary["time_to_target"]["by_phase"] == pytest.approx(
        {"prep": 300.0, "train": 1350.0, "eval": 60.0}
    )
    # The run kept going past the confirmation; that extra time is not part of the bill.
    assert summary["total_seconds"] == pytest.approx(300 + 1800 + 80)


def test_never_met_is_not_reached(ledger: Ledger) -> None:
    run = _seed_run(ledger, "slow", steps=1000, sec_per_step=1.0, cross_step=5000)
    ttt = ledger.run_summary(run)["time_to_target"]
    assert ttt["reached"] is False
    assert ttt["status"] == "not reached"
    assert ttt["seconds"] is None
    summary = ledger.run_summary(run)
    verdict = time_to_target(summary["phases"], summary["evaluations"], "val_loss", THRESHOLD)
    assert verdict.describe() == "target NOT reached"


def test_nan_metric_never_confirms(ledger: Ledger) -> None:
    run = ledger.create_run("nan", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    pid = ledger.record_phase(run, "eval", 1.0)
    ledger.add_evaluation(
        run,
        step=1,
        tokens=1,
        targets=1,
        updates=1,
        metrics={"val_loss": math.nan},
        snapshot="s1",
        phase_id=pid,
    )
    summary = ledger.run_summary(run)
    assert math.isnan(summary["evaluations"][0]["metrics"]["val_loss"])
    assert summary["time_to_target"]["reached"] is False


def test_phase_context_manager_records_seconds_and_detail(ledger: Ledger) -> None:
    run = ledger.create_run("cm", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with ledger.phase(run, "train", step_start=0, lr=0.1) as ph:
        # The row is already committed and open: a second reader sees it mid-block.
        with Ledger(ledger.path) as other:
            open_row = other.run_summary(run)["phases"][0]
        assert open_row["id"] == ph.id and open_row["ended_at"] is None
        assert open_row["detail"] == {"lr": 0.1}
        sum(range(10_000))
        ph.detail["loss"] = 2.5
        ph.step_end = 10
    row = ledger.run_summary(run)["phases"][0]
    assert row["seconds"] > 0
    assert row["ended_at"] >= row["started_at"]
    assert (row["step_start"], row["step_end"]) == (0, 10)
    assert row["detail"] == {"lr": 0.1, "loss": 2.5}


def test_phase_closes_on_exception_and_reraises(ledger: Ledger) -> None:
    run = ledger.create_run("boom", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with pytest.raises(RuntimeError, match="out of memory"), ledger.phase(run, "train"):
        raise RuntimeError("out of memory")
    row = ledger.run_summary(run)["phases"][0]
    assert row["seconds"] is not None and row["seconds"] >= 0
    assert row["ended_at"] is not None
    assert row["detail"]["error"] == repr(RuntimeError("out of memory"))


def test_run_ids_and_resolve_run(ledger: Ledger) -> None:
    kw = {"target_metric": "val_loss", "target_value": 3.0, "eval_every": 10}
    alpha = ledger.create_run("alpha", {}, **kw)
    beta1 = ledger.create_run("beta", {}, **kw)
    beta2 = ledger.create_run("beta", {}, **kw)
    assert re.fullmatch(r"alpha-\d{8}-\d{6}-[0-9a-f]{4}", alpha)
    assert beta1 != beta2
    assert [r["id"] for r in ledger.list_runs()] == [beta2, beta1, alpha]

    assert ledger.resolve_run(beta1) == beta1
    assert ledger.resolve_run("latest") == beta2
    assert ledger.resolve_run("alp") == alpha
    with pytest.raises(LedgerError, match=r"'beta' matches 2 runs: "):
        ledger.resolve_run("beta")
    with pytest.raises(LedgerError, match=r"no run matches 'zzz'"):
        ledger.resolve_run("zzz")


def test_resolve_latest_on_empty_ledger(ledger: Ledger) -> None:
    with pytest.raises(LedgerError):
        ledger.resolve_run("latest")


def test_run_ids_unique_within_one_second(ledger: Ledger) -> None:
    kw = {"target_metric": "val_loss", "target_value": 3.0, "eval_every": 10}
    ids = [ledger.create_run("same", {}, **kw) for _ in range(200)]
    assert len(set(ids)) == len(ids)


def test_second_ledger_sees_rows_and_file_is_sound(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as writer, Ledger(path) as reader:
        run = writer.create_run(
            "wal", {"lr": 1e-3}, target_metric="val_loss", target_value=3.0, eval_every=100
        )
        writer.record_phase(run, "prep", 2.0)
        writer.set_counters(run, {"tokens": 1024, "updates": 3})
        writer.add_event(run, "note", "hello", step=3)
        assert reader.resolve_run("latest") == run
        summary = reader.run_summary(run)
        assert summary["phase_totals"] == {"prep": 2.0}
        assert summary["counters"] == {"tokens": 1024, "updates": 3}
        assert summary["events"][0]["message"] == "hello"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert version[0] == "1"
    conn.close()


def test_summary_is_json_and_counters_upsert(ledger: Ledger) -> None:
    run = ledger.create_run(
        "sum",
        {"model": {"d": 64}},
        target_metric="val_loss",
        target_value=3.0,
        eval_every=1,
        meta={"host": "cpu"},
    )
    ledger.set_versions(run, data_version="d1")
    ledger.set_versions(run, tokens_version="t1")
    ledger.set_counters(run, {"tokens": 10, "loss_sum": 1.5})
    ledger.set_counters(run, {"tokens": 20})
    summary = json.loads(json.dumps(ledger.run_summary(run), allow_nan=False))
    assert summary["run"]["recipe"] == {"model": {"d": 64}}
    assert summary["run"]["meta"] == {"host": "cpu"}
    assert (summary["run"]["data_version"], summary["run"]["tokens_version"]) == ("d1", "t1")
    assert summary["counters"] == {"loss_sum": 1.5, "tokens": 20}
    assert summary["total_seconds"] == 0
    assert summary["time_to_target"]["status"] == "not reached"


def test_invalid_writes_are_refused(ledger: Ledger) -> None:
    run = ledger.create_run("bad", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    other = ledger.create_run("other", {}, target_metric="val_loss", target_value=3.0, eval_every=1)
    with pytest.raises(LedgerError, match="status"):
        ledger.finish_run(run, "done")
    ledger.finish_run(run, "not reached")
    assert ledger.list_runs()[1]["status"] == "not reached"
    with pytest.raises(LedgerError):
        ledger.record_phase("nope", "train", 1.0)
    foreign = ledger.record_phase(other, "eval", 1.0)
    with pytest.raises(LedgerError, match="does not belong"):
        ledger.add_evaluation(
            run,
            step=1,
            tokens=1,
            targets=1,
            updates=1,
            metrics={"val_loss": 1.0},
            snapshot="s",
            phase_id=foreign,
        )


def test_killed_process_leaves_completed_rows_and_open_phase(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    script = f"""
import os
from ledgerlm.ledger import Ledger
led = Ledger({str(path)!r})
run = led.create_run("crash", {{}}, target_metric="val_loss", target_value=3.0, eval_every=1)
led.record_phase(run, "prep", 1.5)
with led.phase(run, "train", step_start=0):
    os._exit(9)
"""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert proc.returncode == 9
    with Ledger(path) as led:
        summary = led.run_summary(led.resolve_run("latest"))
    assert [p["kind"] for p in summary["phases"]] == ["prep", "train"]
    assert summary["phases"][1]["ended_at"] is None
    assert summary["total_seconds"] == pytest.approx(1.5)


def test_steps_are_stored_per_update_and_summarized(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        run = ledger.create_run("r", {}, target_metric="loss", target_value=1.0, eval_every=2)
        rows = [
            {
                "step": i,
                "tokens": 100,
                "targets": 90 + i,
                "loss": 3.0 - i / 10,
                "grad_norm": 1.0,
                "lr": 1e-3,
            }
            for i in (1, 2, 3)
        ]
        ledger.add_steps(run, rows[:2])
        ledger.add_steps(run, rows[2:])
        assert [r["step"] for r in ledger.steps(run)] == [1, 2, 3]
        assert ledger.run_summary(run)["steps_recorded"] == {
            "updates": 3,
            "tokens": 300,
            "targets": 276,
        }
