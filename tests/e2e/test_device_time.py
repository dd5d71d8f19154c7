"""Device time (requirement T7) on real runs of the tiny recipe: two-rank DDP
(torchrun, gloo on CPU) holds two devices, so its device-seconds are twice its wall
seconds, one process's equal its wall; ``ledger compare`` prints both ratios; a
workspace's prices give the bill a cost that a later edit of ``cost.toml`` does not
rewrite; a run resumed on one rank charges its later phases one device; and
``eval.budget_device_hours`` stops a run as not reached, with its reason."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import TINY, ledgerlm
from .ranks import killed_after_checkpoint, on_two_ranks, sets, show

# The updates of one process with twice the accumulation (tests/e2e/test_torchrun.py).
DDP = sets("train.parallel=ddp")
ONE = sets("train.grad_accum=2")
# Every phase counts the devices of the resources event in force (the start-up the one
# recorded after it), so the only slack is float rounding.
TOLERANCE = 1e-9


@pytest.mark.slow
def test_two_ranks_hold_twice_the_device_time_of_their_wall(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "cost.toml").write_text("[cost]\nper_device_hour = {cpu = 0.05}\n")
    on_two_ranks("run", str(TINY), "-w", str(ws), *DDP)
    two = show(ws)
    ledgerlm("run", str(TINY), "-w", str(ws), *ONE)
    one = show(ws)

    held = two["resources"]
    assert (held["device_kind"], held["ranks"], held["devices"], held["hosts"]) == ("cpu", 2, 2, 1)
    assert held["threads_per_rank"] == 1 and held["price"]["key"] == "cpu"
    assert one["resources"]["devices"] == 1
    for run, devices in ((two, 2), (one, 1)):
        assert run["device_seconds"] == pytest.approx(devices * run["total_seconds"], TOLERANCE)
        ttt = run["time_to_target"]
        assert ttt["reached"], run["run"]["id"]
        assert ttt["device_seconds"] == pytest.approx(devices * ttt["seconds"], TOLERANCE)
        assert ttt["device_hours"] == pytest.approx(ttt["device_seconds"] / 3600)
        cost = ttt["cost"]
        assert (cost["key"], cost["currency_per_device_hour"]) == ("cpu", 0.05)
        assert cost["amount"] == pytest.approx(ttt["device_hours"] * 0.05)

    # the price was kept with the resources: a later edit rewrites no old bill
    (ws / "cost.toml").write_text("[cost]\nper_device_hour = {cpu = 9.0}\n")
    assert show(ws)["time_to_target"]["cost"] == one["time_to_target"]["cost"]

    ids = [two["run"]["id"], one["run"]["id"]]
    result = json.loads(ledgerlm("ledger", "compare", *ids, "--json", "-w", str(ws)).stdout)
    (c,) = result["comparisons"]
    wall = one["time_to_target"]["seconds"] / two["time_to_target"]["seconds"]
    device = one["time_to_target"]["device_seconds"] / two["time_to_target"]["device_seconds"]
    assert c["seconds_ratio"] == pytest.approx(wall)
    assert c["device_seconds_ratio"] == pytest.approx(device)
    assert device == pytest.approx(wall / 2, TOLERANCE)  # half the devices, same updates
    flat = " ".join(ledgerlm("ledger", "compare", *ids, "-w", str(ws)).stdout.split())
    assert f"(x{wall:.2f} wall time, x{device:.2f} device time)" in flat
    assert "device-h" in flat
    text = " ".join(ledgerlm("ledger", "show", ids[0], "-w", str(ws)).stdout.split())
    assert "resources: 2 x cpu" in text and "2 ranks on 1 host" in text
    assert f"{two['time_to_target']['device_hours']:.3g} device-hours" in text


@pytest.mark.slow
def test_a_run_resumed_on_one_rank_charges_its_later_phases_one_device(tmp_path):
    ws = tmp_path / "ws"
    run = sets("train.max_steps=12", "train.checkpoint_every=4", "eval.stop_at_target=false")
    killed_after_checkpoint(["run", str(TINY), "-w", str(ws), *run, *DDP], ws, 4)
    killed = show(ws)
    assert killed["run"]["status"] == "interrupted", "the run finished before the kill"
    ledgerlm("resume", killed["run"]["id"], "-w", str(ws))  # one process now
    s = show(ws)
    held = [json.loads(e["message"]) for e in s["events"] if e["kind"] == "resources"]
    assert [r["ranks"] for r in held] == [2, 1] and s["resources"]["devices"] == 1
    (restore,) = [i for i, p in enumerate(s["phases"]) if p["detail"].get("resume")]
    before, after = s["phases"][:restore], s["phases"][restore:]
    for phases, devices in ((before, 2), (after, 1)):
        for p in phases:
            assert p["device_seconds"] == pytest.approx(devices * p["seconds"], TOLERANCE)
    wall = sum(2 * p["seconds"] for p in before) + sum(p["seconds"] for p in after)
    assert s["device_seconds"] == pytest.approx(wall, TOLERANCE)
    assert s["steps_recorded"]["updates"] == 12


def test_a_device_time_budget_stops_a_run_as_not_reached(tmp_path):
    ws = tmp_path / "ws"
    budget = "eval.budget_device_hours=1e-9"  # spent by the first update
    threads = "train.threads=3"  # the threads it trains with, not those it started with
    ledgerlm("run", str(TINY), "-w", str(ws), *sets(budget, "train.max_steps=20", threads))
    run = show(ws)
    held = run["resources"]
    assert held["threads_per_rank"] == 3 and held["host_cores"] == os.cpu_count()
    assert run["run"]["status"] == "not reached"
    assert run["steps_recorded"]["updates"] == 1
    (end,) = [e for e in run["events"] if e["kind"] == "train_end"]
    assert end["message"] == "device-time budget (1e-09 device-hours)"
    contracts = [e["message"] for e in run["events"] if e["kind"] == "target_contract"]
    assert json.loads(contracts[0])["budget_device_hours"] == 1e-9
    text = " ".join(ledgerlm("ledger", "show", "-w", str(ws)).stdout.split())
    assert "device-time budget (1e-09 device-hours)" in text


def test_a_bad_price_table_is_one_line_and_writes_nothing(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "cost.toml").write_text("[cost]\nper_device_hour = {cpu = -0.05}\n")
    proc = ledgerlm("run", str(TINY), "-w", str(ws), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{ws / 'cost.toml'}: per_device_hour.cpu must be a finite number >= 0" in proc.stderr
    assert sorted(p.name for p in ws.iterdir()) == ["cost.toml"]  # no ledger, no run
