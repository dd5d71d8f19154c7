"""Device time on a real ledger: each phase charged wall x the devices in force when it
started (``ledger.resources``), a resume on fewer ranks charging its phases fewer, a
search phase its own figure, the command's start-up the devices of the event after
it, and a run recorded before resources one device; prices by device kind or name."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ledgerlm.config import RecipeError, recipe_from_dict
from ledgerlm.ledger import Ledger, TimeToTarget
from ledgerlm.ledger import resources as res
from ledgerlm.ledger.events import RESOURCES


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger(tmp_path / "ledger.db") as led:
        yield led


def _run(ledger: Ledger) -> str:
    return ledger.create_run("r", {}, target_metric="loss", target_value=3.0, eval_every=1)


def _held(ledger: Ledger, run: str, ranks: int, rate: float | None = None, key="cpu") -> None:
    price = None if rate is None else {"currency_per_device_hour": rate, "key": key}
    message = res.held("cpu", "x86_64", ranks, threads_per_rank=1, host_cores=2, price=price)
    ledger.add_event(run, RESOURCES, json.dumps(message))


def _work(ledger: Ledger, run: str, kind: str, loss: float | None = None, step: int = 0) -> None:
    with ledger.phase(run, kind) as phase:
        time.sleep(0.01)
    if loss is not None:
        ledger.add_evaluation(
            run,
            step=step,
            tokens=step,
            targets=step,
            updates=step,
            metrics={"loss": loss},
            snapshot="s",
            phase_id=phase.id,
        )


def test_each_phase_counts_the_devices_in_force_when_it_started(ledger: Ledger) -> None:
    run = _run(ledger)
    ledger.record_phase(run, "startup", 0.5)  # before the run's first event
    ledger.record_phase(run, "search", 3.0, detail={"device_seconds": 12.0})
    _held(ledger, run, ranks=2)  # the fresh run: 2-rank DDP
    _work(ledger, run, "train")
    _work(ledger, run, "eval", loss=4.0, step=10)
    ledger.record_phase(run, "startup", 0.001)  # the resuming command's: after the 2-rank event
    _held(ledger, run, ranks=1)  # resumed on one rank
    _work(ledger, run, "restore")
    _work(ledger, run, "train")
    _work(ledger, run, "eval", loss=2.0, step=20)  # confirms
    _work(ledger, run, "checkpoint")  # after the confirming evaluation: not on its bill

    summary = ledger.run_summary(run)
    wall = [p["seconds"] for p in summary["phases"]]
    devices = [2, None, 2, 2, 1, 1, 1, 1, 1]  # the search counts its own device time
    assert [p["kind"] for p in summary["phases"]][:2] == ["startup", "search"]
    for phase, n in zip(summary["phases"], devices, strict=True):
        expected = 12.0 if n is None else phase["seconds"] * n
        assert phase["device_seconds"] == pytest.approx(expected), phase["kind"]
    assert summary["phases"][0]["device_seconds"] == pytest.approx(1.0)
    total = sum(p["device_seconds"] for p in summary["phases"])
    assert summary["device_seconds"] == pytest.approx(total)
    assert summary["phase_device_totals"]["train"] == pytest.approx(2 * wall[2] + wall[6])
    assert summary["resources"]["ranks"] == 1 and summary["resources"]["devices"] == 1

    verdict = summary["time_to_target"]
    assert verdict["reached"] and verdict["step"] == 20
    assert verdict["device_seconds"] == pytest.approx(total - wall[8])
    assert verdict["device_hours"] == pytest.approx((total - wall[8]) / 3600)
    assert verdict["seconds"] == pytest.approx(sum(wall) - wall[8])
    assert verdict["cost"] is None  # no price was in force


def test_a_run_recorded_before_resources_counts_one_device(ledger: Ledger) -> None:
    run = _run(ledger)
    ledger.record_phase(run, "startup", 0.5)
    _work(ledger, run, "train")
    _work(ledger, run, "eval", loss=2.0, step=10)
    summary = ledger.run_summary(run)
    assert summary["resources"] is None
    assert summary["device_seconds"] == pytest.approx(summary["total_seconds"])
    for phase in summary["phases"]:
        assert phase["device_seconds"] == pytest.approx(phase["seconds"])
    verdict = summary["time_to_target"]
    assert verdict["device_seconds"] == pytest.approx(verdict["seconds"])
    assert verdict["cost"] is None


def test_the_bill_is_priced_at_the_rate_recorded_with_the_resources(ledger: Ledger) -> None:
    run = _run(ledger)
    _held(ledger, run, ranks=2, rate=3600.0)  # 1 currency per device-second
    _work(ledger, run, "train")
    _work(ledger, run, "eval", loss=2.0, step=10)
    verdict = ledger.run_summary(run)["time_to_target"]
    cost = verdict["cost"]
    assert cost["key"] == "cpu" and cost["currency_per_device_hour"] == 3600.0
    assert cost["amount"] == pytest.approx(verdict["device_seconds"])

    other = _run(ledger)  # priced, then resumed at another rate: the mean rate
    _held(ledger, other, ranks=1, rate=3600.0)
    _work(ledger, other, "train")
    _held(ledger, other, ranks=1, rate=7200.0, key="x86_64")
    _work(ledger, other, "eval", loss=2.0, step=10)
    phases = ledger.run_summary(other)["phases"]
    cost = ledger.run_summary(other)["time_to_target"]["cost"]
    assert cost["key"] == "cpu, x86_64"
    assert cost["amount"] == pytest.approx(phases[0]["seconds"] + 2 * phases[1]["seconds"])

    unpriced = _run(ledger)  # one phase of the bill has no price: no figure at all
    _held(ledger, unpriced, ranks=1, rate=1.0)
    _work(ledger, unpriced, "train")
    _held(ledger, unpriced, ranks=1)
    _work(ledger, unpriced, "eval", loss=2.0, step=10)
    assert ledger.run_summary(unpriced)["time_to_target"]["cost"] is None


def test_a_device_name_beats_its_kind_and_the_recipe_beats_the_workspace() -> None:
    recipe, workspace = {"cpu": 0.05}, {"cpu": 0.5, "x86_64": 0.07, "cuda": 2.5}
    assert res.price("cpu", "x86_64", None, workspace)["key"] == "x86_64"
    assert res.price("cpu", "x86_64", recipe, {"cuda": 2.5}) == {
        "currency_per_device_hour": 0.05,
        "key": "cpu",
        "source": "recipe",
    }
    # in the merged table the name still beats the kind, wherever each came from
    assert res.price("cpu", "x86_64", recipe, workspace)["currency_per_device_hour"] == 0.07
    assert res.price("cuda", "H100", recipe, workspace)["source"] == "workspace"
    assert res.price("cpu", "x86_64", {"cpu": 0.05}, {"cpu": 0.5})["currency_per_device_hour"] == (
        0.05
    )
    assert res.price("mps", "M2", recipe, workspace) is None


def test_workspace_prices_are_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "cost.toml"
    assert res.read_prices(path) == {}  # no file: no prices
    path.write_text('[cost]\nper_device_hour = {cuda = 2.5, cpu = 0.05, "NVIDIA H100" = 4}\n')
    assert res.read_prices(path) == {"cuda": 2.5, "cpu": 0.05, "NVIDIA H100": 4.0}
    path.write_text("[cost]\nper_device_hour = {cuda = -1}\n")
    with pytest.raises(ValueError, match=r"cost.toml: per_device_hour.cuda must be .*>= 0"):
        res.read_prices(path)
    path.write_text("[cost]\nper_gpu_hour = {cuda = 1}\n")
    with pytest.raises(ValueError, match="unknown key 'per_gpu_hour'"):
        res.read_prices(path)
    recipe = recipe_from_dict({"cost": {"per_device_hour": {"cuda": 2.5}}})
    assert recipe.cost.per_device_hour == {"cuda": 2.5}
    with pytest.raises(RecipeError, match=r"cost.per_device_hour.*must be >= 0"):
        recipe_from_dict({"cost": {"per_device_hour": {"cpu": -0.1}}})
    # what a device-hour costs changes nothing a checkpoint depends on
    assert recipe.digest() == recipe_from_dict({}).digest()


def test_hosts_come_from_torchrun_and_resources_from_the_world() -> None:
    assert res.hosts_of({}, 2) == 1
    assert res.hosts_of({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, 16) == 2
    assert res.hosts_of({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, 2) == 1
    held = res.held("cuda", "NVIDIA H200", 16, hosts=2)
    assert held["devices"] == 16 and held["devices_per_rank"] == 1
    with pytest.raises(ValueError, match="ranks"):
        res.held("cpu", "cpu", 0)


def test_an_old_summary_without_device_time_still_reads() -> None:
    old = {
        "reached": True,
        "step": 10,
        "seconds": 5.0,
        "by_phase": {"train": 5.0},
        "evaluation": None,
        "metric": "loss",
        "threshold": 3.0,
    }
    verdict = TimeToTarget.from_dict(old)
    assert verdict.device_seconds is None and verdict.device_hours is None
    assert verdict.to_dict()["cost"] is None
    again = TimeToTarget.from_dict({**old, "device_seconds": 7200.0})
    assert again.device_hours == 2.0


def test_ledger_show_words_the_resources_and_the_device_time(ledger: Ledger) -> None:
    from ledgerlm.cli.render import resources_line, target_line
    from ledgerlm.cli.ui import fmt_g

    old = _run(ledger)
    _work(ledger, old, "eval", loss=2.0, step=10)
    summary = ledger.run_summary(old)
    assert resources_line(summary).startswith("resources: not recorded (an older run, counted")
    hours = summary["time_to_target"]["device_hours"]
    assert target_line(summary).endswith(f"s ({fmt_g(hours)} device-hours)")

    run = _run(ledger)
    _held(ledger, run, ranks=2, rate=2.5)
    _work(ledger, run, "eval", loss=2.0, step=10)
    summary = ledger.run_summary(run)
    ttt = summary["time_to_target"]
    assert resources_line(summary) == (
        "resources: 2 x cpu (x86_64), 2 ranks on 1 host, 1 thread(s) per rank of 2 cores; "
        f"{fmt_g(summary['device_seconds'] / 3600)} device-hours in all at 2.5 per device-hour "
        "(cpu)"
    )
    assert target_line(summary).endswith(
        f"({fmt_g(ttt['device_hours'])} device-hours; cost {ttt['cost']['amount']:,.4g} at 2.5 "
        "per device-hour (cpu))"
    )
