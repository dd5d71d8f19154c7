"""A study's record (``tune/<study>/study.json``): written before the first trial, the
same plan required to continue it, its best trial, and found by name, prefix or latest."""

from __future__ import annotations

import os

import pytest

from ledgerlm.errors import ArgumentError
from ledgerlm.lab.tune import record as rec
from ledgerlm.workspace import Workspace


def _row(number, status, value, **more):
    return {
        "number": number,
        "name": rec.trial_name("s", number),
        "run": f"run{number}",
        "status": status,
        "value": value,
        "params": {},
        "overrides": [f"train.lr={number}"],
        "attempt": 1,
        **more,
    }


def test_record_is_written_before_any_trial_and_read_back(tmp_path):
    ws = Workspace(tmp_path)
    plan = {"base_recipe_sha256": "abc", "trials": 4}
    made = rec.start_record(ws, "tiny-tune-0a1b2c", plan, "time")
    assert ws.study_file("tiny-tune-0a1b2c").is_file()
    assert made["trials"] == [] and made["complete"] is False and made["best"] is None
    assert rec.load_study(ws, "tiny-tune-0a1b2c") == made
    assert rec.start_record(ws, "tiny-tune-0a1b2c", dict(plan), "time") == made


def test_another_plan_under_the_same_name_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    rec.start_record(ws, "s", {"trials": 4}, "time")
    with pytest.raises(ArgumentError, match="another recipe or settings"):
        rec.start_record(ws, "s", {"trials": 5}, "time")


def test_best_is_the_least_ranked_value_and_device_time_is_summed(tmp_path):
    ws = Workspace(tmp_path)
    record = rec.start_record(ws, "s", {}, "time")
    rec.put_trial(record, _row(1, "reached", 2.0, device_seconds=3.0))
    rec.put_trial(record, _row(0, "not reached", 1e9 + 3.1, device_seconds=4.0))
    rec.put_trial(record, _row(2, "pruned", None, device_seconds=0.5))
    rec.put_trial(record, _row(3, "failed", 0.1))  # a failed trial's value ranks nothing
    rec.put_trial(record, _row(1, "reached", 1.5, device_seconds=2.0))  # replaced
    rec.write_record(ws, record)
    back = rec.load_study(ws, "s")
    assert [t["number"] for t in back["trials"]] == [0, 1, 2, 3]
    assert back["best"] == {
        "number": 1,
        "run": "run1",
        "value": 1.5,
        "overrides": ["train.lr=1"],
        "status": "reached",
        "metric": None,
    }
    assert back["device_seconds"] == pytest.approx(6.5)
    with pytest.raises(ValueError, match="status is one of"):
        rec.put_trial(record, _row(4, "interrupted", None))


def test_a_study_is_found_by_prefix_or_latest_and_refused_when_ambiguous(tmp_path):
    ws = Workspace(tmp_path)
    rec.start_record(ws, "tiny-tune-aaaaaa", {"n": 1}, "time")
    rec.start_record(ws, "tiny-tune-aabbbb", {"n": 2}, "metric")
    os.utime(ws.study_file("tiny-tune-aaaaaa"), (1, 1))  # the other one is newer
    assert rec.load_study(ws, "latest")["study"] == "tiny-tune-aabbbb"
    assert rec.load_study(ws, "tiny-tune-aaa")["study"] == "tiny-tune-aaaaaa"
    with pytest.raises(FileNotFoundError, match="matches 2 tuning studies"):
        rec.load_study(ws, "tiny-tune-aa")
    with pytest.raises(FileNotFoundError, match="no tuning study"):
        rec.load_study(ws, "other")
    with pytest.raises(ValueError, match="not a valid id"):
        ws.study_file("../escape")
