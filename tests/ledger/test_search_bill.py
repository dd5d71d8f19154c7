"""A search's bill from its trial runs in a real SQLite ledger: each group of trials
(reached, not reached, pruned, failed, running) with its wall and device time, the
time around the trials, and the search charged to a run as a ``search`` phase whose
table ``ledger show`` prints."""

from __future__ import annotations

import json

import pytest

from ledgerlm.lab.searches import charge, charge_search, trial_summaries
from ledgerlm.ledger import Ledger
from ledgerlm.ledger import search as search_mod
from ledgerlm.ledger.search import search_bill, search_charges, search_rows

# (status, seconds of its phases): two reached, one of each other group
TRIALS = [
    ("reached", (2.0, 3.0)),
    ("reached", (4.0,)),
    ("not reached", (5.0, 1.5)),
    ("pruned", (0.5,)),
    ("failed", (0.25,)),
    ("running", (1.0,)),
]


def _trial(ledger: Ledger, i: int, status: str, seconds) -> str:
    run = ledger.create_run(
        f"s-t{i:02d}", {"train": {"lr": i}}, target_metric="loss", target_value=3.0, eval_every=1
    )
    for s in seconds:
        ledger.record_phase(run, "train", s)
    if status != "running":
        ledger.finish_run(run, status)
    return run


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as found:
        yield found


@pytest.fixture
def trials(ledger) -> list[str]:
    return [_trial(ledger, i, status, secs) for i, (status, secs) in enumerate(TRIALS)]


def test_each_group_holds_its_trials_wall_and_device_time(ledger, trials):
    summaries = trial_summaries(ledger, [*trials, None, "no-such-run"])
    assert len(summaries) == len(TRIALS)  # a trial with no run in this ledger has none
    bill = search_bill(summaries, seconds=20.0)
    groups = bill["groups"]
    assert list(groups) == ["reached", "not reached", "pruned", "failed", "running"]
    assert {g: v["trials"] for g, v in groups.items()} == {
        "reached": 2, "not reached": 1, "pruned": 1, "failed": 1, "running": 1
    }  # fmt: skip
    assert groups["reached"]["seconds"] == pytest.approx(9.0)
    assert groups["not reached"]["seconds"] == pytest.approx(6.5)
    # device time: the ledger's own, on one device for a CPU run
    for g, v in groups.items():
        want = sum(search_mod.device_seconds(s) for s in summaries if s["run"]["status"] == g)
        assert v["device_seconds"] == pytest.approx(want)
    assert bill["trials"]["seconds"] == pytest.approx(17.25)
    # the search's 20 s: 2.75 s around its trials (counted on one device), all of it in total
    assert bill["outside"]["seconds"] == pytest.approx(2.75)
    assert bill["total"] == pytest.approx(
        {"trials": 6, "seconds": 20.0, "device_seconds": bill["trials"]["device_seconds"] + 2.75}
    )


def test_a_summary_with_device_time_counts_it_not_its_wall_time(ledger, trials):
    (s,) = trial_summaries(ledger, trials[:1])
    assert s["device_seconds"] == pytest.approx(5.0)  # recorded before resources: 1 device
    assert search_mod.device_seconds({**s, "device_seconds": 10.0}) == 10.0
    bill = search_bill([{**s, "device_seconds": 10.0}], seconds=6.0, device=12.5)
    assert bill["groups"]["reached"]["device_seconds"] == 10.0
    assert bill["outside"] == {"seconds": pytest.approx(1.0), "device_seconds": 2.5}
    assert bill["total"]["device_seconds"] == 12.5


def test_an_interrupted_trial_counts_as_running():
    s = {"run": {"status": "interrupted"}, "total_seconds": 1.0, "device_seconds": 2.0}
    assert search_bill([s])["groups"]["running"]["trials"] == 1


def test_the_rows_of_the_table(ledger, trials):
    bill = search_bill(trial_summaries(ledger, trials[:5]), seconds=18.0)
    rows = search_rows(bill)
    # running only when a trial is; the time around the trials; all
    assert [r["group"] for r in rows] == [
        "reached", "not reached", "pruned", "failed", "outside trials", "all"
    ]  # fmt: skip
    assert [r["trials"] for r in rows] == [2, 1, 1, 1, None, 5]
    assert rows[-1]["seconds"] == pytest.approx(18.0)
    assert rows[-1]["device_hours"] == pytest.approx(bill["total"]["device_seconds"] / 3600)
    assert sum(r["device_hours"] for r in rows[:-1]) == pytest.approx(rows[-1]["device_hours"])
    with_running = search_rows(search_bill(trial_summaries(ledger, trials)))
    assert [r["group"] for r in with_running][-2:] == ["running", "all"]


def test_a_search_charged_to_a_run_is_a_phase_with_its_bill(ledger, trials, capsys):
    from ledgerlm.cli.render import print_searches

    run = ledger.create_run("r", {}, target_metric="loss", target_value=3.0, eval_every=1)
    found = charge("tune", "s[/b]", trials, trial_summaries(ledger, trials), 30.0, 40.0)
    charge_search(ledger, run, found)
    summary = ledger.run_summary(run)
    (phase,) = [p for p in summary["phases"] if p["kind"] == "search"]
    assert phase["seconds"] == pytest.approx(30.0)
    assert set(phase["detail"]) == {"kind", "search_id", "trials", "device_seconds", "bill"}
    assert phase["detail"]["trials"] == trials
    assert phase["detail"]["device_seconds"] == pytest.approx(40.0)
    assert summary["phase_totals"]["search"] == pytest.approx(30.0)
    # the run's device time holds the search's device time, not its wall x devices
    assert summary["phase_device_totals"]["search"] == pytest.approx(40.0)
    assert summary["device_seconds"] == pytest.approx(40.0)
    (shown,) = search_charges(summary)
    assert shown["kind"] == "tune" and shown["seconds"] == pytest.approx(30.0)
    # a search phase of older code (no bill) has no table
    ledger.record_phase(run, "search", 1.0, detail={"search_id": "old", "trials": []})
    print_searches(ledger.run_summary(run))
    out = capsys.readouterr().out
    assert out.count(": 6 trials") == 1  # one heading, then its table
    assert "tune study s[/b]: 6 trials" in out  # escaped: printed as itself
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if len(cells := [c.strip() for c in line.split("\u2502")]) == 4
    }
    assert rows["pruned"][0] == "1" and rows["all"][0] == "6"
    outside = (40.0 - found["bill"]["trials"]["device_seconds"]) / 3600
    assert rows["outside trials"] == ["", "12.8 s", f"{outside:.3g}"]  # 30 - 17.25 s
    assert json.loads(json.dumps(phase["detail"]))["bill"]["total"]["trials"] == 6


def test_a_mixture_search_keeps_its_bill_and_charges_it_to_the_run_using_it(tmp_path):
    from ledgerlm.config import recipe_from_dict
    from ledgerlm.lab.mix_search.record import SearchClock
    from ledgerlm.lab.searches import resolve_searches
    from ledgerlm.workspace import Workspace, atomic_write_json

    ws = Workspace(tmp_path)
    with Ledger(ws.ledger_path) as ledger:
        runs = [_trial(ledger, i, status, secs) for i, (status, secs) in enumerate(TRIALS[:3])]
    record = {"search_id": "r-mix-abc123", "trials": [{"run": r} for r in runs]}
    record.update(recommended={"code": 0.5, "math": 0.5}, objective="loss", other_seconds=1.0)
    SearchClock(record, ws).stamp(record, trial_seconds=15.5)  # as mix search writes it
    atomic_write_json(ws.search_file("r-mix-abc123"), record)
    assert record["seconds"] > 16.5  # the trials, the second before and this command's
    bill = record["bill"]
    assert bill["groups"]["reached"]["trials"] == 2 and bill["groups"]["not reached"]["trials"] == 1
    assert bill["total"]["seconds"] == pytest.approx(record["seconds"])
    assert record["device_seconds"] == pytest.approx(bill["total"]["device_seconds"])

    recipe = recipe_from_dict({"data": {"mixture": {"from_search": "r-mix"}}})
    with Ledger(ws.ledger_path) as ledger:
        used, (found,) = resolve_searches(recipe, ws, ledger)
        run = ledger.create_run("r", used.to_dict(), target_metric="loss", target_value=3.0,
                                eval_every=1)  # fmt: skip
        charge_search(ledger, run, found)
        summary = ledger.run_summary(run)
    assert used.data.mixture.from_search == "r-mix-abc123"
    (phase,) = [p for p in summary["phases"] if p["kind"] == "search"]
    assert phase["seconds"] == pytest.approx(record["seconds"])
    detail = phase["detail"]
    assert detail["kind"] == "mix" and detail["trials"] == runs and detail["objective"] == "loss"
    assert detail["device_seconds"] == pytest.approx(record["device_seconds"])
    assert detail["bill"]["groups"] == bill["groups"]  # the same runs, summed alike
