"""Requirement S1: running a sweep (a failed point stays in it) and reading its points back from
the ledger. The plans themselves: tests/scaling/test_sweep.py."""

import json
import re

import numpy as np
import pytest

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.lab.scaling.fit import fit
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.lab.scaling.summary import fit_summary
from ledgerlm.lab.sweep import record_plan, run_sweep, sweep_id_of, sweep_points
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.events import SWEEP
from ledgerlm.ledger.store import LedgerError
from ledgerlm.scaling.law import LawParams
from ledgerlm.scaling.sweep import SweepError, plan
from ledgerlm.shape import param_count
from ledgerlm.workspace import Workspace

BASE = load_recipe(TINY)  # d_model 64, 16 rows x 64 positions = 1,024 tokens per step


# -- reading points back (a ledger written through its API, no training) -------------


def _fake_run(ledger, name, recipe, *, tokens, losses, event=None, status="not reached"):
    run = ledger.create_run(
        name, recipe.to_dict(), target_metric="loss", target_value=1.0, eval_every=10
    )
    for i, loss in enumerate(losses, 1):
        ledger.add_evaluation(
            run,
            step=10 * i,
            tokens=tokens * i // len(losses),
            targets=0,
            updates=10 * i,
            metrics={"loss": loss},
            snapshot=f"s{i}",
            phase_id=None,
        )
    ledger.set_counters(run, {"tokens": tokens, "optimizer_updates": 10 * len(losses)})
    if event is not None:
        ledger.add_event(run, SWEEP, json.dumps(event))
    ledger.finish_run(run, status)
    return run


def test_sweep_points_read_n_tokens_and_final_loss(tmp_path):
    points = plan(BASE, [2e5, 5e5], tokens=[1e5, 2e5])
    sid = "tiny-sweep-abc123"
    with Ledger(tmp_path / "ledger.db") as ledger:
        ids = []
        for i, p in enumerate(points):
            event = {"sweep_id": sid, "index": i, "of": 4, "point": p.to_dict(), "N": p.N - 7}
            status = "failed" if i == 3 else "not reached"
            ids.append(
                _fake_run(
                    ledger,
                    f"{sid}-{p.name}",
                    p.recipe(BASE),
                    tokens=p.D - 100,
                    losses=[5.0, 4.0 - i / 10],
                    event=event,
                    status=status,
                )
            )
        other = _fake_run(ledger, "unrelated", BASE, tokens=5000, losses=[4.4])
        for ref in (sid, "tiny-sweep-a", "latest"):
            found = sweep_points(ledger, ref)
            assert found.sweep_id == sid and found.runs == ids[:3]
            N, D, loss = found
            assert N.tolist() == [p.N - 7 for p in points[:3]]  # the N the run recorded
            assert D.tolist() == [p.D - 100 for p in points[:3]]  # the tokens counter
            assert loss.tolist() == [4.0, 3.9, 3.8]  # the last evaluation
            assert found.skipped == [(ids[3], "status failed")]
            assert found.distinct() == 3
            assert found.rules[0]["lr_rule"] == "fixed"

        by_runs = sweep_points(ledger, [ids[0][:-2], other])
        assert by_runs.sweep_id is None
        # without a sweep event N comes from the stored recipe (here the tiny shape)
        assert by_runs.N.tolist() == [points[0].N - 7, 133_440]
        assert by_runs.loss.tolist() == [4.0, 4.4]

        # a run named for the sweep without its event (killed before the event) is listed
        orphan = _fake_run(ledger, f"{sid}-N1k-D1k", BASE, tokens=9, losses=[9.0], status="running")
        found = sweep_points(ledger, sid)
        assert found.runs == ids[:3] and found.skipped[-1] == (orphan, "status running")

        with pytest.raises(LedgerError, match="no sweep matches 'nope'"):
            sweep_points(ledger, "nope")
        _fake_run(
            ledger,
            "tiny-sweep-abd999-x",
            BASE,
            tokens=1,
            losses=[1.0],
            event={"sweep_id": "tiny-sweep-abd999", "index": 0, "point": points[0].to_dict()},
        )
        with pytest.raises(LedgerError, match="matches 2 sweeps"):
            sweep_points(ledger, "tiny-sweep-ab")


def test_the_fit_names_planned_points_without_a_result(tmp_path):
    # a plan of 6 points kept before the sweep ran; 4 finished, 1 interrupted, 1 never ran
    points = plan(BASE, [5e4, 9e4, 1.3e5], tokens=[2e4, 4e4])
    ws = Workspace(tmp_path)
    sid = sweep_id_of(BASE, points)
    record_plan(ws, sid, BASE, points)
    law = LawParams(E=1.8, A=300.0, B=900.0, alpha=0.32, beta=0.30)

    def finished(ledger, i):
        p = points[i]
        event = {"sweep_id": sid, "index": i, "of": 6, "point": p.to_dict(), "N": p.N}
        loss = float(law.predict(np.array([p.N]), np.array([p.D]))[0])
        name = f"{sid}-{p.name}"
        return _fake_run(ledger, name, p.recipe(BASE), tokens=p.D, losses=[loss], event=event)

    with Ledger(ws.ledger_path) as ledger:
        for i in range(4):
            finished(ledger, i)
        recipe = points[4].recipe(BASE)
        killed = ledger.create_run(
            f"{sid}-{points[4].name}",
            recipe.to_dict(),
            target_metric="loss",
            target_value=1.0,
            eval_every=1,
        )
    ws.run_dir(killed).mkdir(parents=True)
    (ws.run_dir(killed) / ".lock").touch()  # nobody holds it: the process died
    line = (
        f"sweep {sid}: 2 of 6 planned points have no result: N=1.3e5 D=2e4 (run {killed}: "
        "interrupted); N=1.3e5 D=4.1e4 (not run)"
    )
    with pytest.raises(ValueError, match=re.escape(f"got 4; {line}")):
        fit(load_points(sid, workspace=ws))

    with Ledger(ws.ledger_path) as ledger:
        finished(ledger, 5)
    summary = fit_summary(fit(load_points(sid, workspace=ws)))
    line = (
        f"sweep {sid}: 1 of 6 planned points has no result: N=1.3e5 D=2e4 (run {killed}: "
        "interrupted)"
    )
    assert summary["warnings"][0] == line and summary["missing"]["planned"] == 6
    assert summary["missing"]["points"] == [
        {
            "point": points[4].name,
            "N": points[4].N,
            "D": points[4].D,
            "run": killed,
            "why": "interrupted",
        }
    ]
    # a sweep without a kept plan (older code) has nothing to say about missing points
    ws.sweep_file(sid).unlink()
    assert fit_summary(fit(load_points(sid, workspace=ws)))["missing"] is None


def test_n_without_a_sweep_event_uses_the_trained_vocabulary(tmp_path):
    ws = Workspace(tmp_path)
    folder = ws.version_dir("tokens", "tok1")
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"tokenizer": {"vocab_size": 400}}))
    with Ledger(ws.ledger_path) as ledger:
        run = _fake_run(ledger, "r", BASE, tokens=100, losses=[4.0])
        ledger.set_versions(run, tokens_version="tok1")
        assert sweep_points(ledger, [run]).N.tolist() == [param_count(64, 2, 512)]
        assert sweep_points(ledger, [run], ws).N.tolist() == [param_count(64, 2, 400)]


# -- running (real runs, each failing once its data and tokens are ready) ------------


def test_a_failed_point_stays_in_the_sweep(tmp_path):
    # eval.metric names a domain the data lacks: each run fails after data and tokens
    base = load_recipe(TINY, ["eval.metric=loss/poetry"])
    points = plan(base, [5e4, 9e4], tokens=[2e4])
    ws = Workspace(tmp_path)
    with pytest.raises(ValueError, match="loss/poetry"):
        run_sweep(base, points, ws, sweep_id="tiny-sweep-000001")
    ids = run_sweep(base, points, ws, sweep_id="tiny-sweep-000002", keep_going=True)
    with Ledger(ws.ledger_path) as ledger:
        assert [ledger.run_summary(i)["run"]["status"] for i in ids] == ["failed", "failed"]
        for sid, n in (("tiny-sweep-000001", 1), ("tiny-sweep-000002", 2)):
            found = sweep_points(ledger, sid, ws)
            assert len(found) == 0 and [why for _, why in found.skipped] == ["status failed"] * n
        event = _event(ledger, ids[1])
        assert event["index"] == 1 and "loss/poetry" in event["failed"]
        # the sweep's bill: its failed runs, their wall and device time, kept with its plan
        kept = json.loads(ws.sweep_file("tiny-sweep-000002").read_text())
        wall = sum(ledger.run_summary(i)["total_seconds"] for i in ids)
        assert kept["trials"] == ids and kept["seconds"] == pytest.approx(wall) and wall > 0
        assert kept["bill"]["groups"]["failed"]["trials"] == 2
        assert kept["device_seconds"] == pytest.approx(kept["bill"]["total"]["device_seconds"])
        assert sweep_points(ledger, "tiny-sweep-000002", ws).bill == kept["bill"]
    # run again, the sweep continues its failed point in the same ledger run (a restart,
    # as it had no checkpoint), where it fails again: no second run of it
    with pytest.raises(ValueError, match="loss/poetry"):
        run_sweep(base, points, ws, sweep_id="tiny-sweep-000002")
    with Ledger(ws.ledger_path) as ledger:
        assert len(ledger.list_runs()) == 3
        restores = [p for p in ledger.run_summary(ids[0])["phases"] if p["kind"] == "restore"]
        assert [p["detail"]["restart"] for p in restores] == [True]
    with pytest.raises(SweepError, match="expected a name of"):
        run_sweep(base, points, ws, sweep_id="../mine")


def _event(ledger, run_id):
    summary = ledger.run_summary(run_id)
    return json.loads(next(e["message"] for e in summary["events"] if e["kind"] == SWEEP))
