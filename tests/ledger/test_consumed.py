"""The tokens the runs on a data version consumed per domain (``data inspect``), read
from the ledger: the runs on that version only, newest first, each beside its plan."""

from __future__ import annotations

import json

from ledgerlm.ledger import Ledger
from ledgerlm.ledger.events import MIXTURE_PLAN
from ledgerlm.ledger.mixture import consumed_by_runs

PLAN = {"domains": [{"domain": "web", "weight": 0.75, "expected_tokens": 300, "pool": 200}]}


def _run(led: Ledger, version: str, counters: dict[str, float], plan: bool = True) -> str:
    run = led.create_run(
        "r", {}, target_metric="loss", target_value=1.0, eval_every=1, data_version=version
    )
    if plan:
        led.add_event(run, MIXTURE_PLAN, json.dumps(PLAN))
    led.set_counters(run, counters)
    led.finish_run(run, "not reached")
    return run


def test_the_runs_on_a_version_with_their_tokens_per_domain(tmp_path):
    path = tmp_path / "ledger.db"
    assert consumed_by_runs(path, "v1") == []  # no ledger yet: no run consumed anything
    assert not path.exists()
    with Ledger(path) as led:
        older = _run(led, "v1", {"tokens/web": 300, "tokens/code": 100})
        _run(led, "v2", {"tokens/web": 50})
        _run(led, "v1", {}, plan=False)  # failed before it planned: no row
        newer = _run(led, "v1", {"tokens/web": 100})
    found = consumed_by_runs(path, "v1")
    assert [r["run"] for r in found] == [newer, older]
    assert all(r["status"] == "not reached" for r in found)
    web, code = found[1]["domains"]
    assert (web["domain"], web["tokens"], web["share"], web["exposure"]) == ("web", 300, 0.75, 1.5)
    assert (code["domain"], code["tokens"], code["weight"]) == ("code", 100, None)
