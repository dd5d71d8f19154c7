"""Every optimizer update is in the ledger with the tokens and targets it consumed."""

import json

from .conftest import ledgerlm


def test_per_update_records_add_up_to_the_counters(tiny_workspace, tiny_run_id):
    ws = str(tiny_workspace)
    s = json.loads(ledgerlm("ledger", "show", tiny_run_id, "--json", "-w", ws).stdout)
    recorded, counters = s["steps_recorded"], s["counters"]
    assert recorded["updates"] == counters["optimizer_updates"] > 0
    assert recorded["tokens"] == counters["tokens"]
    assert recorded["targets"] == counters["supervised_targets"]


def test_ledger_steps_gives_the_per_update_series(tiny_workspace, tiny_run_id):
    import csv
    import io

    ws = str(tiny_workspace)
    s = json.loads(ledgerlm("ledger", "show", tiny_run_id, "--json", "-w", ws).stdout)
    steps = ledgerlm("ledger", "steps", tiny_run_id, "-w", ws, "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(steps)))
    assert len(rows) == s["counters"]["optimizer_updates"]
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1))
    assert sum(int(r["tokens"]) for r in rows) == s["counters"]["tokens"]
    for r in rows:
        assert float(r["seconds"]) > 0
        assert float(r["tokens_per_second"]) == float(r["tokens"]) / float(r["seconds"])
    as_json = json.loads(ledgerlm("ledger", "steps", tiny_run_id, "-w", ws, "--json").stdout)
    assert as_json["run"] == s["run"]["id"] and len(as_json["steps"]) == len(rows)
