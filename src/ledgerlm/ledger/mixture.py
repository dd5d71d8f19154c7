"""The mixture a run planned and the one it realised: the plan it recorded before
training (a ``mixture_plan`` event) beside the tokens it really consumed per domain
(its ``tokens/<domain>`` counters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledgerlm.ledger.events import MIXTURE_PLAN, latest_json
from ledgerlm.ledger.store import Ledger

DOMAIN_COUNTER = "tokens/"  # prefix of a per-domain consumed-tokens counter


def plan_event(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The plan a run recorded before training (its ``mixture_plan`` event), if any."""
    return latest_json(summary, MIXTURE_PLAN)


def realised(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per domain: the configured (planned) weight, the tokens really consumed, their
    share of all consumed tokens, the unique pool and the exposure so far (epochs)."""
    planned = plan_event(summary) or {"domains": []}
    consumed = {
        name.split("/", 1)[1]: int(v)
        for name, v in summary["counters"].items()
        if name.startswith(DOMAIN_COUNTER)
    }
    total = sum(consumed.values())
    rows = []
    for d in planned["domains"]:
        used = consumed.get(d["domain"], 0)
        pool = d["pool"]
        rows.append(
            {
                "domain": d["domain"],
                "weight": d["weight"],
                "planned_tokens": d["expected_tokens"],
                "tokens": used,
                "share": used / total if total else None,
                "pool": pool,
                "exposure": used / pool if pool else None,
            }
        )
    known = {r["domain"] for r in rows}
    for name in sorted(set(consumed) - known):  # a run recorded before plans existed
        used = consumed[name]
        rows.append(
            {
                "domain": name,
                "weight": None,
                "planned_tokens": None,
                "tokens": used,
                "share": used / total if total else None,
                "pool": None,
                "exposure": None,
            }
        )
    return rows


def consumed_by_runs(ledger_path: Path, version: str) -> list[dict]:
    """Per run on data version ``version`` (newest first): the training tokens it
    consumed per domain, their share and the epochs over the domain's train tokens; none
    when there is no ledger yet."""
    if not ledger_path.is_file():
        return []
    with Ledger(ledger_path) as ledger:
        runs = [r for r in ledger.list_runs() if r["data_version"] == version]
        out = []
        for r in runs:
            rows = realised(ledger.run_summary(r["id"]))
            if rows:
                out.append({"run": r["id"], "status": r["status"], "domains": rows})
    return out
