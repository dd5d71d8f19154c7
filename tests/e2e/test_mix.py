"""Mixtures end to end on the built-in corpus (code, docs, math): the plan, a mixed run
whose consumed tokens per domain are in the ledger, a tiny proxy search, a run charged
for the search it uses, and the verification at scale."""

from __future__ import annotations

import json
import shutil

import pytest

from ledgerlm.config import load_recipe
from ledgerlm.lab.mixture import plan_recipe
from ledgerlm.ledger.mixture import realised
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

from .conftest import TINY, ledgerlm

# Proxy trials: a one-layer model for a few updates (seconds each).
PROXY = ["--proxy", "model.n_layers=1", "--proxy", "train.max_steps=6", "--proxy",
         "eval.every_steps=3"]  # fmt: skip
SHORT = ["--set", "train.max_steps=12", "--set", "eval.every_steps=6"]
MIX = "data.mixture.weights={code=0.2,docs=0.3,math=0.5}"


@pytest.fixture(scope="module")
def ws(tiny_run, tmp_path_factory):
    """The tiny run's data and token versions, in a workspace of this module's own (its
    tests add runs to it, so each reads back the runs it made by their ids)."""
    root = tmp_path_factory.mktemp("mix") / "ws"
    for kind in ("data", "tokens"):
        shutil.copytree(tiny_run.ws / kind, root / kind)
    return root


def _show(ws, run):
    """A run's summary read in process (each CLI call costs a few seconds of start-up)."""
    with Ledger(ws / "ledger.db") as ledger:
        summary = ledger.run_summary(ledger.resolve_run(run))
    return {**summary, "mixture": realised(summary)}


def _ids(ws) -> set[str]:
    if not (ws / "ledger.db").exists():
        return set()
    with Ledger(ws / "ledger.db", read_only=True) as ledger:
        return {r["id"] for r in ledger.list_runs()}


def _run(ws, *args: str) -> tuple[str, str]:
    """``ledgerlm run`` of the tiny recipe in ``ws``: the id of the run it added, and
    what it printed."""
    before = _ids(ws)
    proc = ledgerlm("run", str(TINY), "-w", str(ws), *args)
    (run,) = _ids(ws) - before
    return run, proc.stdout


@pytest.fixture(scope="module")
def mixed(ws) -> tuple[str, str]:
    """A run of the mixture code 0.2, docs 0.3, math 0.5: its id and what it printed."""
    return _run(ws, "--set", MIX, *SHORT)


def test_plan_of_the_natural_mixture(ws):
    out = json.loads(ledgerlm("mix", "plan", str(TINY), "-w", str(ws), "--json").stdout)
    domains = {d["domain"]: d for d in out["domains"]}
    assert sorted(domains) == ["code", "docs", "math"]
    assert sum(d["weight"] for d in domains.values()) == pytest.approx(1)
    # 200 updates of 16 rows x 64 tokens
    assert out["budget_tokens"] == 200 * 16 * 64
    for d in domains.values():
        assert d["pool"] > 0
        assert d["exposure"] == pytest.approx(d["weight"] * out["budget_tokens"] / d["pool"])


def test_a_mixed_run_records_the_tokens_it_consumed_per_domain(ws, mixed):
    run, printed = mixed
    assert "mixture plan for 12,288 training tokens" in printed
    assert "mixture: configured and consumed" in printed
    s = json.loads(ledgerlm("ledger", "show", run, "-w", str(ws), "--json").stdout)
    rows = {r["domain"]: r for r in s["mixture"]}
    assert sum(r["tokens"] for r in rows.values()) == s["counters"]["tokens"] == 12 * 16 * 64
    for domain, weight in (("code", 0.2), ("docs", 0.3), ("math", 0.5)):
        assert rows[domain]["weight"] == pytest.approx(weight)
        # within one long document of the weight, in 12,288 tokens
        assert abs(rows[domain]["share"] - weight) < 0.05
    # per evaluation interval: the consumed tokens at each evaluation
    consumed = [sum(e["consumed"].values()) for e in s["evaluations"]]
    assert consumed == [e["tokens"] for e in s["evaluations"]] == [6144, 12288]


def test_an_unknown_domain_is_one_line_before_training(ws):
    proc = ledgerlm(
        "run", str(TINY), "-w", str(ws), "--set", "data.mixture.weights={web=1.0}", check=False
    )
    assert proc.returncode == 2
    assert (
        "error:" in proc.stderr
        and "web" in proc.stderr
        and "domains: code, docs, math" in proc.stderr
    )


@pytest.mark.slow
def test_search_then_a_run_charged_for_it(ws):
    proc = ledgerlm("mix", "search", str(TINY), "-w", str(ws), "--trials", "3", *PROXY, "--json")
    record = json.loads(proc.stdout)
    assert len(record["trials"]) == 3 and record["trials"][0]["weights"] == record["natural"]
    assert sum(record["recommended"].values()) == pytest.approx(1)
    assert set(record["regressions"]) == {"loss", "loss/code", "loss/docs", "loss/math"}
    assert (ws / "mixtures" / f"{record['search_id']}.json").is_file()
    trial = _show(ws, record["trials"][1]["run"])
    assert trial["run"]["name"] == f"{record['search_id']}-t01"
    assert any(e["kind"] == "mix_search" for e in trial["events"])
    assert trial["run"]["recipe"]["eval"]["stop_at_target"] is False

    use = f"data.mixture.from_search={record['search_id'][:-2]}"  # a unique prefix
    planned = plan_recipe(load_recipe(TINY, [use]), Workspace(ws))
    assert {d.domain: d.weight for d in planned.domains} == pytest.approx(record["recommended"])
    assert record["bill"]["groups"]["not reached"]["trials"] == 3  # no stop at the target
    assert record["device_seconds"] == pytest.approx(record["bill"]["total"]["device_seconds"])
    charged, printed = _run(ws, "--set", use, *SHORT)
    s = _show(ws, charged)
    (search,) = [p for p in s["phases"] if p["kind"] == "search"]
    assert search["seconds"] == pytest.approx(record["seconds"])
    # its device time: the trials' and the time around them, in the run's device time
    detail = search["detail"]
    assert detail["kind"] == "mix" and detail["trials"] == [t["run"] for t in record["trials"]]
    assert detail["device_seconds"] == pytest.approx(record["device_seconds"])
    assert s["phase_device_totals"]["search"] == pytest.approx(record["device_seconds"])
    title = f"mixture search {record['search_id']}: 3 trials"
    assert title in printed and title in ledgerlm("ledger", "show", charged, "-w", str(ws)).stdout
    assert s["run"]["recipe"]["data"]["mixture"]["from_search"] == record["search_id"]
    assert s["phase_totals"]["search"] == pytest.approx(record["seconds"])
    assert s["coverage"]["uncovered_seconds"] < 0.2


def test_verify_runs_the_found_and_the_baseline_mixture(ws, tmp_path):
    mixture = tmp_path / "m.json"
    mixture.write_text(json.dumps({"code": 0.2, "docs": 0.2, "math": 0.6}))
    out = json.loads(
        ledgerlm(
            "mix", "verify", str(TINY), "-w", str(ws), "--mixture", str(mixture), *SHORT, "--json"
        ).stdout
    )
    assert [r["domain"] for r in out["domains"]] == ["all", "code", "docs", "math"]
    found, base = _show(ws, out["runs"]["found"]), _show(ws, out["runs"]["baseline"])
    assert found["run"]["recipe"]["data"]["mixture"]["weights"]["math"] == pytest.approx(0.6)
    assert base["run"]["recipe"]["data"]["mixture"]["weights"] == "natural"
    math_row = next(r for r in out["domains"] if r["domain"] == "math")
    last = found["evaluations"][-1]["metrics"]["loss/math"]
    assert math_row["found"] == pytest.approx(last)
    assert math_row["delta"] == pytest.approx(
        last - base["evaluations"][-1]["metrics"]["loss/math"]
    )


def test_report_and_data_inspect_show_the_consumed_tokens(ws, mixed, tmp_path):
    run, _ = mixed
    page = tmp_path / "r.html"
    ledgerlm("report", run, "-w", str(ws), "-o", str(page))
    html = page.read_text()
    assert "Mixture: configured and consumed" in html and "math" in html
    s = _show(ws, run)
    version = s["run"]["data_version"]
    out = json.loads(ledgerlm("data", "inspect", version, "-w", str(ws), "--json").stdout)
    (row,) = [r for r in out["consumed_by_runs"] if r["run"] == run]
    assert {d["domain"]: d["tokens"] for d in row["domains"]} == {
        d: int(s["counters"][f"tokens/{d}"]) for d in ("code", "docs", "math")
    }


def test_a_doremi_search_reweights_at_each_evaluation(ws):
    record = json.loads(
        ledgerlm(
            "mix", "search", str(TINY), "-w", str(ws), "--method", "doremi", *PROXY, "--json"
        ).stdout
    )
    assert [h["step"] for h in record["history"]] == [3, 6]
    assert record["history"][0]["weights"] == pytest.approx([1 / 3] * 3)
    assert sum(record["recommended"].values()) == pytest.approx(1)
    proxy = _show(ws, record["proxy_run"]["run"])
    assert proxy["run"]["name"] == f"{record['search_id']}-proxy"
    # the second interval sampled by the reweighted mixture: the consumed tokens of
    # each evaluation interval are in the ledger
    first, second = (e["consumed"] for e in proxy["evaluations"][:2])
    assert sum(second.values()) - sum(first.values()) == 3 * 16 * 64
