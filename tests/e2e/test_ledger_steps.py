"""Every optimizer update is in the ledger with the tokens and targets it consumed."""

import json

from .conftest import ledgerlm


def test_per_update_records_add_up_to_the_counters(tiny_workspace):
    s = json.loads(ledgerlm("ledger", "show", "latest", "--json", "-w", str(tiny_workspace)).stdout)
    recorded, counters = s["steps_recorded"], s["counters"]
    assert recorded["updates"] == counters["optimizer_updates"] > 0
    assert recorded["tokens"] == counters["tokens"]
    assert recorded["targets"] == counters["supervised_targets"]
