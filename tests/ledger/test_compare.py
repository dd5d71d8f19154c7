"""Comparing runs (requirement T5) on the T4 worked ledger, and `ledgerlm ledger compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import TINY, ledgerlm
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.compare import (
    DEVICE_RULE,
    NO_TEST,
    RULE,
    compare_runs,
    comparison_rows,
    flatten,
    recipe_diff,
    train_step_seconds,
)
from ledgerlm.ledger.events import RESOURCES
from ledgerlm.ledger.resources import held
from ledgerlm.workspace import Workspace
from seed_ledger import seed_run


def recipe(seed: int = 0, lr: float = 1e-3, name: str = "r", **train) -> dict:
    return {"name": name, "train": {"seed": seed, "lr": lr, **train}, "eval": {"target": 3.0}}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger(tmp_path / "ledger.db") as led:
        yield led


def _abcd(ledger: Ledger) -> list[dict]:
    a = seed_run(ledger, "a", recipe(), steps=2000, sec_per_step=1.0, cross_step=2000)
    b = seed_run(ledger, "b", recipe(compile=True), steps=2000, sec_per_step=0.6, cross_step=2000)
    c = seed_run(ledger, "c", recipe(lr=3e-4), steps=4000, sec_per_step=0.8, cross_step=4000)
    d = seed_run(
        ledger, "d", recipe(lr=3e-3), steps=2000, sec_per_step=0.9, cross_step=1200, prep=300
    )
    return [ledger.run_summary(r) for r in (a, b, c, d)]


def test_seed_example_per_run_figures(ledger: Ledger) -> None:
    result = compare_runs(_abcd(ledger))
    a, _, _, d = result["runs"]
    assert [r["time_to_target"] for r in result["runs"]] == pytest.approx([2080, 1280, 3360, 1710])
    assert [r["steps_to_target"] for r in result["runs"]] == [2000, 2000, 4000, 1500]
    assert a["tokens_to_target"] == 2000 * 4096
    assert a["targets_to_target"] == 2000 * 4000
    assert d["updates_to_target"] == 1500
    assert [r["train_step_seconds"] for r in result["runs"]] == pytest.approx([1.0, 0.6, 0.8, 0.9])
    # D: 300 s prep, 4 x 450 s train, 4 x 20 s eval = 2180 s in all.
    assert d["total_seconds"] == pytest.approx(2180)
    assert d["shares"]["prep"] == pytest.approx(300 / 2180)
    assert d["shares"]["eval"] == pytest.approx(80 / 2180)
    assert d["shares"]["checkpoint"] == 0
    assert d["shares"]["train"] == pytest.approx(1800 / 2180)
    assert a["shares"]["prep"] == 0
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_execution_versus_recipe(ledger: Ledger) -> None:
    result = compare_runs(_abcd(ledger))
    assert result["baseline"] == result["runs"][0]["id"]
    b, c, d = result["comparisons"]
    # A vs B: the same 2000 steps, each faster: an execution speed-up.
    assert b["class"] == "execution"
    assert b["seconds_delta"] == pytest.approx(-800)
    assert b["step_seconds_ratio"] == pytest.approx(0.6)
    assert b["by_phase_delta"] == pytest.approx({"train": -800, "eval": 0})
    assert "faster" in b["reason"]
    assert b["recipe_diff"] == ["train.compile: - -> true"]
    # A vs C: twice the steps to reach the target: the recipe, not the speed.
    assert c["class"] == "recipe"
    assert c["reason"].startswith("more steps to target (4000 vs 2000)")
    assert c["recipe_diff"] == ["train.lr: 0.001 -> 0.0003"]
    assert c["final"] == NO_TEST
    # A vs D: fewer steps (confirmed at 1500) despite 300 s of prep.
    assert d["class"] == "recipe"
    assert d["steps_delta"] == -500
    assert d["seconds_delta"] == pytest.approx(1710 - 2080)
    assert result["rule"] == RULE
    for word in ("'execution'", "'recipe'", "'not comparable'", "train.seed", "test-set"):
        assert word in RULE


def test_unreached_or_different_targets_are_not_comparable(ledger: Ledger) -> None:
    a = seed_run(ledger, "a", recipe(), steps=2000, sec_per_step=1.0, cross_step=2000)
    slow = seed_run(ledger, "slow", recipe(), steps=1000, sec_per_step=1.0, cross_step=5000)
    other = seed_run(
        ledger, "t", recipe(), steps=2000, sec_per_step=1.0, cross_step=2000, threshold=2.5
    )
    summaries = [ledger.run_summary(r) for r in (a, slow, other)]
    result = compare_runs(summaries)
    assert result["runs"][1]["reached"] is False
    assert result["runs"][1]["time_to_target"] is None
    # how far it got: its last evaluation (step 1000 of a curve crossing at 5000)
    assert result["runs"][1]["final_value"] == pytest.approx(3.0 + (5000 - 1000) / 1000)
    assert result["runs"][1]["steps_to_target"] is None
    by_run = {c["run"]: c for c in result["comparisons"]}
    assert by_run[slow]["class"] == "not comparable"
    assert by_run[slow]["reason"] == f"target not reached by {slow}"
    assert by_run[other]["class"] == "not comparable"
    assert by_run[other]["reason"] == "different targets"
    # An unreached baseline makes every comparison "not comparable".
    flipped = compare_runs([summaries[1], summaries[0]])
    assert flipped["comparisons"][0]["class"] == "not comparable"


def test_seed_runs_are_grouped_with_mean_and_spread(ledger: Ledger) -> None:
    ids = [
        seed_run(ledger, f"a-s{s}", recipe(seed=s, name=f"a-s{s}"), steps=2000,
                 sec_per_step=sps, cross_step=2000)
        for s, sps in ((0, 1.0), (1, 1.1), (2, 0.9))
    ]  # fmt: skip
    ids.append(seed_run(ledger, "c", recipe(lr=3e-4), steps=4000, sec_per_step=1, cross_step=4000))
    result = compare_runs([ledger.run_summary(r) for r in ids])
    first, second = result["seed_groups"]
    assert first["runs"] == ids[:3]
    assert first["seeds"] == [0, 1, 2]
    assert (first["n"], first["n_reached"], first["distinct_seeds"]) == (3, 3, 3)
    ttt = first["time_to_target"]  # 2080, 2280, 1880
    assert ttt["n"] == 3
    assert (ttt["mean"], ttt["min"], ttt["max"]) == pytest.approx((2080, 1880, 2280))
    assert ttt["std"] == pytest.approx(200)  # sample standard deviation
    assert first["steps_to_target"]["std"] == 0
    assert second["runs"] == [ids[3]]
    assert second["n"] == 1 and second["time_to_target"]["std"] is None
    # Same steps, other seed: execution-like timing noise between seeds.
    assert result["comparisons"][0]["class"] == "execution"
    assert result["comparisons"][0]["seed_only"] is True


def test_seed_only_difference_in_steps_is_labelled_seed_variation(ledger: Ledger) -> None:
    a = seed_run(ledger, "a", recipe(seed=0), steps=2000, sec_per_step=1, cross_step=2000)
    b = seed_run(ledger, "a", recipe(seed=7), steps=2000, sec_per_step=1, cross_step=1500)
    (cmp,) = compare_runs([ledger.run_summary(a), ledger.run_summary(b)])["comparisons"]
    assert cmp["class"] == "recipe"
    assert cmp["recipe_diff"] == ["train.seed: 0 -> 7"]
    assert cmp["seed_only"] is True
    assert "seed variation" in cmp["reason"]


def test_final_figure_needs_a_test_split(ledger: Ledger) -> None:
    a = seed_run(ledger, "a", recipe(), steps=2000, sec_per_step=1, cross_step=2000)
    b = seed_run(ledger, "b", recipe(lr=3e-3), steps=2000, sec_per_step=1, cross_step=1500)
    result = compare_runs([ledger.run_summary(a), ledger.run_summary(b)])
    assert result["final_figure"] == NO_TEST
    assert result["validation_is_tuning_set"] is True
    assert result["comparisons"][0]["final"] == NO_TEST
    assert all(r["test"] is None for r in result["runs"])

    ta = seed_run(
        ledger, "ta", recipe(), steps=2000, sec_per_step=1, cross_step=2000, test_loss=3.2
    )
    tb = seed_run(
        ledger, "tb", recipe(lr=3e-3), steps=2000, sec_per_step=1, cross_step=1500, test_loss=3.1
    )
    result = compare_runs([ledger.run_summary(ta), ledger.run_summary(tb)])
    assert result["final_figure"] != NO_TEST
    # Read at the confirming snapshots: step 2000 for ta, 1500 for tb.
    assert result["runs"][0]["test"]["step"] == 2000
    assert result["runs"][1]["test"]["metrics"] == {"test_loss": pytest.approx(3.1)}
    (cmp,) = result["comparisons"]
    assert cmp["final"] == "final figure: test_loss 3.1000 vs 3.2000 (baseline), delta -0.1000"


def test_hand_built_summary_without_step_bounds_uses_the_update_counter() -> None:
    summary = {
        "phases": [{"id": 1, "kind": "train", "seconds": 50.0}],
        "phase_totals": {"train": 50.0},
        "counters": {"optimizer_updates": 100},
    }
    assert train_step_seconds(summary) == (0.5, 100)
    assert train_step_seconds({"phases": [], "phase_totals": {}, "counters": {}}) == (None, None)
    # An open (crashed) train segment counts on neither side.
    summary["phases"] = [
        {"id": 1, "kind": "train", "seconds": 10.0, "step_start": 0, "step_end": 20},
        {"id": 2, "kind": "train", "seconds": None, "step_start": 20, "step_end": None},
    ]
    assert train_step_seconds(summary) == (0.5, 20)


def test_recipe_diff_and_empty_input() -> None:
    assert recipe_diff({"a": {"b": 1}, "c": 2}, {"a": {"b": 1}, "d": "x"}) == [
        "c: 2 -> -",
        'd: - -> "x"',
    ]
    with pytest.raises(ValueError, match="at least one run"):
        compare_runs([])


def test_an_empty_recipe_section_is_no_difference_of_its_own() -> None:
    # eval.targets = {} beside a filled one: the added key differs, the empty table not
    base, other = {"eval": {"targets": {}}}, {"eval": {"targets": {"loss/code": 3.0}}}
    assert recipe_diff(base, other) == ["eval.targets.loss/code: - -> 3.0"]
    assert recipe_diff(base, {}) == []
    # the report's legend labels and the sinks' parameters keep the empty table as a key
    assert flatten(base) == {"eval.targets": {}}
    assert flatten(base, keep_empty=False) == {}


# -- the command line -------------------------------------------------------------------


def test_cli_escapes_markup_in_run_names(tmp_path: Path) -> None:
    with Ledger(Workspace(tmp_path).ledger_path) as led:
        a = seed_run(led, "[red]x[/red]", recipe(), steps=2000, sec_per_step=1, cross_step=2000)
        b = seed_run(led, "b", recipe(compile=True), steps=2000, sec_per_step=0.6, cross_step=2000)
    out = ledgerlm("ledger", "compare", a, b, "-w", str(tmp_path)).stdout
    assert a in out
    assert "execution" in out and "faster" in out
    assert NO_TEST in out
    # runs recorded before resources: the table and lines of before, no device time
    assert "device-h" not in out and "device time" not in out
    missing = ledgerlm("ledger", "compare", "nope", "-w", str(tmp_path), check=False)
    assert missing.returncode == 2 and "no run matches 'nope'" in missing.stderr


@pytest.fixture(scope="module")
def two_tiny_runs(tmp_path_factory) -> tuple[Path, list[str]]:
    ws = tmp_path_factory.mktemp("cmp")
    # A short budget and an easy target keep this cheap; both seeds still confirm it.
    short = ("--set", "train.max_steps=60", "--set", "eval.every_steps=10")
    short += ("--set", "eval.target_loss=5.6")
    ledgerlm("run", str(TINY), "-w", str(ws), *short)
    ledgerlm("run", str(TINY), "-w", str(ws), *short, "--set", "train.seed=1")
    runs = json.loads(ledgerlm("ledger", "list", "--json", "-w", str(ws)).stdout)
    return ws, [r["id"] for r in reversed(runs)]


def test_cli_compare_two_tiny_runs(two_tiny_runs) -> None:
    ws, ids = two_tiny_runs
    result = json.loads(ledgerlm("ledger", "compare", *ids, "--json", "-w", str(ws)).stdout)
    assert [r["id"] for r in result["runs"]] == ids
    assert result["baseline"] == ids[0]
    assert result["rule"] == RULE
    assert result["final_figure"] == NO_TEST
    base, other = result["runs"]
    for run in (base, other):
        assert run["reached"] is True
        assert run["time_to_target"] > 0
        assert run["train_step_seconds"] > 0
        assert run["steps_to_target"] == run["updates_to_target"]
        assert 0 < run["shares"]["eval"] < 1
    (cmp,) = result["comparisons"]
    assert cmp["recipe_diff"] == ["train.seed: 0 -> 1"]
    expected = "execution" if base["steps_to_target"] == other["steps_to_target"] else "recipe"
    assert cmp["class"] == expected
    (group,) = result["seed_groups"]
    assert (group["n"], group["seeds"], group["n_reached"]) == (2, [0, 1], 2)

    table = ledgerlm("ledger", "compare", *ids, "-w", str(ws)).stdout
    for text in (*ids, "vs baseline", "seed group 0: 2 runs", NO_TEST, "rule:"):
        assert text in table


def test_per_domain_deltas_and_per_domain_targets(ledger: Ledger) -> None:
    from ledgerlm.ledger.compare import domain_deltas, run_figures

    def run(name: str, code: float, math_: float, targets: dict | None = None) -> dict:
        meta = {"contract": {"confirm": 1, "targets": targets or {}}}
        rid = ledger.create_run(
            name, recipe(), target_metric="loss", target_value=3.0, eval_every=10, meta=meta
        )
        phase = ledger.record_phase(rid, "eval", 1.0, step_start=10, step_end=10)
        metrics = {"loss": 2.0, "loss/code": code, "loss/math": math_}
        ledger.add_evaluation(
            rid, step=10, tokens=1, targets=1, updates=10, metrics=metrics, snapshot="s",
            phase_id=phase,
        )  # fmt: skip
        return ledger.run_summary(rid)

    base, other = run("a", 3.0, 2.0), run("b", 2.75, 2.5)
    rows = domain_deltas(run_figures(base), run_figures(other))
    assert rows == [
        {"domain": "code", "baseline": 3.0, "run": 2.75, "delta": pytest.approx(-0.25)},
        {"domain": "math", "baseline": 2.0, "run": 2.5, "delta": pytest.approx(0.5)},
    ]
    result = compare_runs([base, other, run("c", 3.0, 2.0, targets={"code": 2.9})])
    assert result["comparisons"][0]["domains"] == rows
    assert result["comparisons"][1]["class"] == "not comparable"  # other per-domain targets
    assert result["comparisons"][1]["reason"] == "different targets"


def _held_on(ledger: Ledger, run: str, ranks: int) -> None:
    """The run's resources, recorded after its seeded phases: they all count them."""
    ledger.add_event(run, RESOURCES, json.dumps(held("cpu", "x86_64", ranks)))


def _faster_on_two(ledger: Ledger) -> tuple[str, str]:
    a = seed_run(ledger, "a", recipe(), steps=2000, sec_per_step=1.0, cross_step=2000)
    b = seed_run(ledger, "b", recipe(compile=True), steps=2000, sec_per_step=0.6, cross_step=2000)
    _held_on(ledger, a, 1)
    _held_on(ledger, b, 2)  # 1280 s of wall on 2 devices: 2560 device-seconds
    return a, b


def test_device_time_beside_wall_time(ledger: Ledger) -> None:
    a, b = _faster_on_two(ledger)
    result = compare_runs([ledger.run_summary(r) for r in (a, b)])
    assert result["resources_recorded"] is True
    assert [r["device_seconds_to_target"] for r in result["runs"]] == pytest.approx([2080, 2560])
    (c,) = result["comparisons"]
    assert c["seconds_ratio"] == pytest.approx(1280 / 2080)
    assert c["device_seconds_ratio"] == pytest.approx(2560 / 2080)
    assert c["device_seconds_delta"] == pytest.approx(480)
    assert c["wall_device"] == (
        f"{b} reaches the target 38% sooner in wall time but costs 23% more device time"
    )
    hours = [row["device_hours"] for row in comparison_rows(result)]
    assert hours == pytest.approx([2080 / 3600, 2560 / 3600])
    flipped = compare_runs([ledger.run_summary(r) for r in (b, a)])["comparisons"][0]
    assert flipped["wall_device"] == (
        f"{a} reaches the target 62% later in wall time but costs 19% less device time"
    )
    c_ = seed_run(ledger, "c", recipe(), steps=2000, sec_per_step=1.0, cross_step=2000)
    plain = compare_runs([ledger.run_summary(r) for r in (c_, c_)])
    assert plain["resources_recorded"] is False
    assert plain["comparisons"][0]["wall_device"] is None  # the same both ways


def test_cli_compare_prints_both_ratios_once_resources_are_recorded(tmp_path: Path) -> None:
    with Ledger(Workspace(tmp_path).ledger_path) as led:
        a, b = _faster_on_two(led)
    out = ledgerlm("ledger", "compare", a, b, "-w", str(tmp_path)).stdout
    flat = " ".join(out.split())
    assert "device-h" in out
    assert "(x0.62 wall time, x1.23 device time)" in flat
    assert "sooner in wall time but costs 23% more device time" in flat
    assert " ".join(DEVICE_RULE.split()) in flat
