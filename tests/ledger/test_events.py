"""Events read back from a run's summary: a kind recorded more than once is read by its
latest event, the one in force, by every reader (``ledger show`` and the MLLOG export
alike)."""

from __future__ import annotations

import json

import pytest

from cli_runner import TINY
from ledgerlm.cli.render import contract, target_contract_line
from ledgerlm.config import load_recipe
from ledgerlm.ledger import Ledger, events
from ledgerlm.ledger.compare import held_out_metrics
from ledgerlm.ledger.events import TARGET_CONTRACT, latest, target_contract
from ledgerlm.report import mllog

FIRST = {"unit": "nat/token", "val_targets": 999, "val_unigram_entropy": 5.0, "ranks": 1}
LATER = {"unit": "nat/token", "val_targets": 1234, "val_unigram_entropy": 4.5, "ranks": 2}


def _two_contracts(tmp_path) -> dict:
    with Ledger(tmp_path / "ledger.db") as led:
        run = led.create_run(
            "twice",
            load_recipe(TINY).to_dict(),
            target_metric="loss",
            target_value=4.0,
            eval_every=10,
        )
        led.add_event(run, TARGET_CONTRACT, json.dumps(FIRST))
        led.add_event(run, "resume", "from step 10", step=10)
        led.add_event(run, TARGET_CONTRACT, json.dumps(LATER))
        led.finish_run(run, "not reached")
        return led.run_summary(run)


def test_a_run_with_two_contracts_is_read_by_its_latest_everywhere(tmp_path):
    summary = _two_contracts(tmp_path)
    assert [e["kind"] for e in summary["events"]].count(TARGET_CONTRACT) == 2
    assert latest(summary, TARGET_CONTRACT)["message"] == json.dumps(LATER)
    assert target_contract(summary) == LATER
    assert contract(summary) == LATER
    assert mllog._contract(summary) == LATER
    assert "the 1,234 val targets: 4.500 nat/token" in target_contract_line(summary)


def test_the_mllog_target_line_carries_the_latest_contract(tmp_path):
    pytest.importorskip("mlperf_logging")
    summary = _two_contracts(tmp_path)
    events = mllog.mllog_events(summary)
    (target,) = [e for e in events if e.key == mllog.TARGET_KEY]
    assert target.metadata["val_targets"] == 1234
    assert target.metadata["val_unigram_entropy"] == 4.5


def test_a_kind_never_recorded_reads_as_none(tmp_path):
    summary = _two_contracts(tmp_path)
    assert latest(summary, "mixture_plan") is None
    assert target_contract({"events": []}) is None
    assert contract({"events": []}) is None


def test_both_readers_go_through_the_one_lookup(tmp_path, monkeypatch):
    # Mutation check: a lookup that took the first event would make both read FIRST.
    summary = _two_contracts(tmp_path)

    def first(summary, kind):
        return next((e for e in summary["events"] if e["kind"] == kind), None)

    monkeypatch.setattr(events, "latest", first)
    assert contract(summary) == FIRST
    assert mllog._contract(summary) == FIRST


def test_the_comparison_takes_the_test_score_from_its_event():
    score = {"step": 40, "snapshot": "w40", "metrics": {"test/loss": 3.5}, "targets": 9}
    events = [{"kind": "test_evaluation", "message": json.dumps(score)}]
    evaluation = {"step": 30, "snapshot": "w30", "metrics": {"test/loss": 9.0}}
    summary = {"events": events, "evaluations": [evaluation], "time_to_target": None}
    assert held_out_metrics(summary) == {k: score[k] for k in ("step", "snapshot", "metrics")}
    assert held_out_metrics({**summary, "events": []})["step"] == 30
