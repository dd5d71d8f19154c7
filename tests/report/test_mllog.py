"""MLLOG export: lines rebuilt from the ledger, judged by mlperf_logging's own checker.

Synthetic ledgers (written through the same Ledger/PhaseClock calls as a run) cover
the shape of the log and the rules, including logs broken on purpose that the checker
must reject; two real runs of configs/tiny.toml, one that reaches its target and one
that does not, go through the CLI and the checker's own command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_runner import TINY, ledgerlm
from ledgerlm.cli import ledger_cmd
from ledgerlm.config import load_recipe
from ledgerlm.extras import MissingExtraError
from ledgerlm.ledger import Ledger
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.report.mllog import RULES, check_mllog, export_mllog

TOKEN = ":::MLLOG "


@pytest.fixture
def mlperf():
    """The exporter and the checker need mlperf-logging (a dev extra)."""
    pytest.importorskip("mlperf_logging")


def read(path: Path) -> list[dict]:
    return [json.loads(line[len(TOKEN) :]) for line in path.read_text().splitlines()]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(f"{TOKEN}{json.dumps(r)}\n" for r in records))
    return path


def keyed(records: list[dict], key: str) -> list[dict]:
    return [r for r in records if r["key"] == key]


# -- synthetic runs --------------------------------------------------------------------

EVERY = 10


def synthetic_run(
    ws: Path, losses: list[float | None], target: float, *, unbound_last: bool = False
) -> str:
    """A run as the runner records it: prep, tokenize, the validation set, then train
    segments interrupted by evaluations every EVERY updates, and a final checkpoint."""
    recipe = load_recipe(TINY, [f"eval.target_loss={target}", f"eval.every_steps={EVERY}"])
    with Ledger(ws / "ledger.db") as led:
        run = led.create_run(
            "synth",
            recipe.to_dict(),
            target_metric="loss",
            target_value=target,
            eval_every=EVERY,
        )
        with led.phase(run, "prep"):
            pass
        with led.phase(run, "tokenize"):
            pass
        with led.phase(run, "eval", what="build validation set"):
            pass
        contract = {"metric": "loss", "threshold": target, "val_targets": 999, "ranks": 1}
        led.add_event(run, "target_contract", json.dumps(contract))
        clock = PhaseClock(led, run)
        clock.start("train", 0)
        for i, loss in enumerate(losses, 1):
            step = i * EVERY
            phase_id = None
            if not (unbound_last and i == len(losses)):
                with clock.interrupt("eval", step) as phase:
                    phase_id = phase.id
            led.add_evaluation(
                run,
                step=step,
                tokens=step * 1024,
                targets=step * 1000,
                updates=step,
                metrics={"loss": loss, "loss/code": loss},
                snapshot=f"weights-{step}",
                phase_id=phase_id,
            )
        clock.stop(len(losses) * EVERY)
        with led.phase(run, "checkpoint"):
            pass
        reached = any(x is not None and x <= target for x in losses)
        led.finish_run(run, "reached" if reached else "not reached")
    return run


def summary_of(ws: Path, run: str) -> dict:
    with Ledger(ws / "ledger.db") as led:
        return led.run_summary(run)


@pytest.fixture
def reached_log(mlperf, tmp_path) -> tuple[dict, Path]:
    # Confirmed at the third evaluation; two more were made (stop_at_target = false).
    run = synthetic_run(tmp_path, [6.0, 5.0, 3.9, 3.5, 3.2], target=4.0)
    summary = summary_of(tmp_path, run)
    return summary, export_mllog(summary, tmp_path / "reached.txt")


@pytest.fixture
def aborted_log(mlperf, tmp_path) -> tuple[dict, Path]:
    run = synthetic_run(tmp_path, [6.0, None, 5.0], target=4.0)
    summary = summary_of(tmp_path, run)
    return summary, export_mllog(summary, tmp_path / "aborted.txt")


def test_a_reached_run_stops_at_its_confirming_evaluation(reached_log):
    summary, path = reached_log
    records = read(path)
    assert check_mllog(path) == []
    accuracies = keyed(records, "eval_accuracy")
    assert [a["value"] for a in accuracies] == [6.0, 5.0, 3.9]  # later evaluations left out
    assert [a["metadata"]["epoch_num"] for a in accuracies] == [10, 20, 30]
    batch = keyed(records, "global_batch_size")[0]["value"]
    assert batch == 16  # tiny: 16 rows x 1 micro-batch x 1 rank
    assert [a["metadata"]["samples_count"] for a in accuracies] == [160, 320, 480]
    assert [a["metadata"]["tokens"] for a in accuracies] == [10240, 20480, 30720]
    (stop,) = keyed(records, "run_stop")
    assert stop is records[-1]
    assert stop["metadata"]["status"] == "success"
    assert stop["metadata"]["evaluations_after_target"] == 2
    assert stop["time_ms"] == accuracies[-1]["time_ms"]
    assert summary["time_to_target"]["step"] == 30
    # the ledger's bill in wall and device time (a run recorded before resources: 1 device)
    ttt = summary["time_to_target"]
    assert stop["metadata"]["ledger_time_to_target_s"] == ttt["seconds"]
    assert stop["metadata"]["ledger_device_seconds_to_target"] == ttt["device_seconds"]
    assert ttt["device_seconds"] == pytest.approx(ttt["seconds"])


def test_run_stop_carries_the_device_time_of_the_bill(reached_log, tmp_path):
    summary, _ = reached_log
    on_two = {**summary, "resources": {**(summary["resources"] or {}), "devices": 2}}
    ttt = summary["time_to_target"]
    on_two["time_to_target"] = {**ttt, "device_seconds": 2 * ttt["seconds"]}
    (stop,) = keyed(read(export_mllog(on_two, tmp_path / "two.txt")), "run_stop")
    assert stop["metadata"]["ledger_devices"] == 2
    assert stop["metadata"]["ledger_device_seconds_to_target"] == 2 * ttt["seconds"]
    assert stop["metadata"]["ledger_time_to_target_s"] == ttt["seconds"]


def test_the_log_is_timed_by_the_ledger(reached_log):
    summary, path = reached_log
    records = read(path)

    def ms(t: float) -> int:
        return round(t * 1000)

    phases = summary["phases"]
    tokenize = next(p for p in phases if p["kind"] == "tokenize")
    first_train = next(p for p in phases if p["kind"] == "train")
    evals = [p for p in phases if p["kind"] == "eval"][1:]  # [0] builds the validation set
    assert keyed(records, "init_start")[0]["time_ms"] == ms(summary["run"]["created_at"])
    assert keyed(records, "init_stop")[0]["time_ms"] == ms(tokenize["ended_at"])
    assert keyed(records, "run_start")[0]["time_ms"] == ms(tokenize["ended_at"])
    assert keyed(records, "block_start")[0]["time_ms"] == ms(first_train["started_at"])
    starts = [r["time_ms"] for r in keyed(records, "eval_start")]
    stops = [r["time_ms"] for r in keyed(records, "eval_stop")]
    assert starts == [ms(p["started_at"]) for p in evals[:3]]
    assert stops == [ms(p["ended_at"]) for p in evals[:3]]
    assert [r["time_ms"] for r in keyed(records, "block_stop")] == starts
    created = [ms(e["created_at"]) for e in summary["evaluations"][:3]]
    assert [r["time_ms"] for r in keyed(records, "eval_accuracy")] == created
    times = [r["time_ms"] for r in records]
    assert times == sorted(times)


def test_the_export_is_a_pure_function_of_the_summary(reached_log, tmp_path):
    summary, path = reached_log
    again = export_mllog(json.loads(json.dumps(summary)), tmp_path / "again" / "log.txt")
    assert again.read_bytes() == path.read_bytes()


def test_hyperparameters_come_from_the_stored_recipe(reached_log):
    summary, path = reached_log
    values = {r["key"]: r["value"] for r in read(path) if r["event_type"] == "POINT_IN_TIME"}
    train = summary["run"]["recipe"]["train"]
    assert values["submission_benchmark"] == "ledgerlm_synth"
    assert values["submission_org"] == "ledgerlm"
    assert values["submission_division"] == "open"
    assert values["submission_status"] == "research"
    assert values["opt_base_learning_rate"] == train["lr"] == 3e-3
    assert values["opt_learning_rate_warmup_steps"] == train["warmup_steps"] == 5
    assert values["max_steps"] == train["max_steps"] == 200
    assert values["seed"] == train["seed"] == 0
    assert values["opt_name"] == "adamw"
    assert values["max_sequence_length"] == 64
    assert values["gradient_accumulation_steps"] == 1
    assert values["eval_accuracy_target"] == 4.0


def test_a_run_that_never_reaches_its_target_is_aborted(aborted_log):
    summary, path = aborted_log
    records = read(path)
    assert check_mllog(path) == []
    assert [a["value"] for a in keyed(records, "eval_accuracy")] == [6.0, None, 5.0]
    (stop,) = keyed(records, "run_stop")
    assert stop["metadata"]["status"] == "aborted"
    # An aborted run ends at the last instant the ledger knows: after its checkpoint.
    checkpoint = next(p for p in summary["phases"] if p["kind"] == "checkpoint")
    assert stop["time_ms"] == round(checkpoint["ended_at"] * 1000)


def test_an_evaluation_without_a_phase_is_timed_by_its_row(mlperf, tmp_path):
    run = synthetic_run(tmp_path, [6.0, 3.0], target=4.0, unbound_last=True)
    summary = summary_of(tmp_path, run)
    records = read(export_mllog(summary, tmp_path / "log.txt"))
    assert check_mllog(tmp_path / "log.txt") == []
    created = round(summary["evaluations"][-1]["created_at"] * 1000)
    assert keyed(records, "eval_start")[-1]["time_ms"] == created
    assert keyed(records, "eval_stop")[-1]["time_ms"] == created


# -- the checker must be able to fail --------------------------------------------------


def _drop_first(key):
    def mutate(records):
        i = next(i for i, r in enumerate(records) if r["key"] == key)
        return records[:i] + records[i + 1 :]

    return mutate


def _duplicate(key):
    def mutate(records):
        i = next(i for i, r in enumerate(records) if r["key"] == key)
        return records[: i + 1] + records[i:]

    return mutate


def _edit_last(key, fn):
    def mutate(records):
        i = max(i for i, r in enumerate(records) if r["key"] == key)
        fn(records[i])
        return records

    return mutate


def _swap_first(a, b):
    def mutate(records):
        i = next(i for i, r in enumerate(records) if r["key"] == a)
        j = next(j for j, r in enumerate(records) if r["key"] == b)
        records[i], records[j] = records[j], records[i]
        return records

    return mutate


BROKEN_REACHED = {
    "run_stop removed": _drop_first("run_stop"),
    "run_start removed": _drop_first("run_start"),
    "init_stop removed": _drop_first("init_stop"),
    "an eval_stop removed": _drop_first("eval_stop"),
    "a block_stop removed": _drop_first("block_stop"),
    "submission_org removed": _drop_first("submission_org"),
    "global_batch_size removed": _drop_first("global_batch_size"),
    "target removed": _drop_first("eval_accuracy_target"),
    "run_start twice": _duplicate("run_start"),
    "global_batch_size twice": _duplicate("global_batch_size"),
    "eval_stop before eval_start": _swap_first("eval_start", "eval_stop"),
    "run_stop before run_start": _swap_first("run_start", "run_stop"),
    "success without reaching": _edit_last("eval_accuracy", lambda r: r.update(value=4.5)),
    "reached but aborted": _edit_last("run_stop", lambda r: r["metadata"].update(status="aborted")),
    "no status": _edit_last("run_stop", lambda r: r["metadata"].pop("status")),
    "accuracy without samples_count": _edit_last(
        "eval_accuracy", lambda r: r["metadata"].pop("samples_count")
    ),
    "accuracy without epoch_num": _edit_last(
        "eval_accuracy", lambda r: r["metadata"].pop("epoch_num")
    ),
    "time runs backwards": _edit_last("run_stop", lambda r: r.update(time_ms=0)),
    "training after the target": lambda records: (
        records[:-1] + [r for r in records if r["key"] == "block_start"][:1] + records[-1:]
    ),
}


@pytest.mark.parametrize("mutation", list(BROKEN_REACHED))
def test_the_checker_rejects_a_broken_reached_log(reached_log, tmp_path, mutation):
    _, path = reached_log
    assert check_mllog(path) == []
    broken = write(tmp_path / "broken.txt", BROKEN_REACHED[mutation](read(path)))
    assert check_mllog(broken), f"{mutation}: the checker accepted it"


def test_the_checker_rejects_a_broken_aborted_log(aborted_log, tmp_path):
    _, path = aborted_log
    success = _edit_last("run_stop", lambda r: r["metadata"].update(status="success"))
    assert check_mllog(write(tmp_path / "a.txt", success(read(path))))
    # Reaching the target and carrying on is not an aborted run either.
    records = read(path)
    keyed(records, "eval_accuracy")[0]["value"] = 3.0
    assert check_mllog(write(tmp_path / "b.txt", records))


def test_a_repeated_key_with_equal_values_fails_only_with_werror(reached_log, tmp_path):
    _, path = reached_log
    twice = write(tmp_path / "twice.txt", _duplicate("seed")(read(path)))
    assert check_mllog(twice) and check_mllog(twice, werror=True)
    assert check_mllog(twice, werror=False) == []


def test_without_mlperf_logging_the_error_names_the_package(tmp_path, monkeypatch):
    run = synthetic_run(tmp_path, [6.0], target=4.0)
    summary = summary_of(tmp_path, run)
    monkeypatch.setitem(sys.modules, "mlperf_logging", None)  # import raises ImportError
    with pytest.raises(
        MissingExtraError, match=r"mlperf-logging package: pip install 'ledgerlm\[mllog\]'"
    ):
        export_mllog(summary, tmp_path / "log.txt")
    assert not (tmp_path / "log.txt").exists()


def test_the_cli_check_fails_a_run_that_never_evaluated(mlperf, tmp_path):
    synthetic_run(tmp_path, [], target=4.0)  # no evaluation, so no result to report
    args = ["export-mllog", "latest", "--check", "-w", str(tmp_path)]
    result = CliRunner().invoke(ledger_cmd.app, args)
    assert result.exit_code == 1, result.output
    assert "run_stop status aborted" in result.stdout
    assert "'eval_accuracy' but found 0" in result.stderr
    assert "compliance check FAILED" in result.stderr


def test_the_cli_says_which_package_is_missing(tmp_path, monkeypatch):
    synthetic_run(tmp_path, [6.0], target=4.0)
    monkeypatch.setitem(sys.modules, "mlperf_logging", None)
    result = CliRunner().invoke(ledger_cmd.app, ["export-mllog", "-w", str(tmp_path)])
    assert result.exit_code == 2
    assert "pip install 'ledgerlm[mllog]'" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_the_cli_names_a_run_it_cannot_find(mlperf, tmp_path):
    synthetic_run(tmp_path, [6.0], target=4.0)
    args = ["export-mllog", "no-such-run", "-w", str(tmp_path)]
    result = CliRunner().invoke(ledger_cmd.app, args)
    assert result.exit_code == 2
    assert "no run matches 'no-such-run'" in result.stderr


# -- real runs through the CLI ---------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    pytest.importorskip("mlperf_logging")
    return tmp_path_factory.mktemp("mllog-ws")


def _ids(ws: Path) -> set[str]:
    if not (ws / "ledger.db").exists():
        return set()
    with Ledger(ws / "ledger.db", read_only=True) as led:
        return {r["id"] for r in led.list_runs()}


def _tiny(ws: Path, target: float) -> str:
    """A 10-update run in ``ws`` (two fixtures share it): the id of the run it added."""
    before = _ids(ws)
    ledgerlm(
        "run",
        str(TINY),
        "--workspace",
        str(ws),
        "--set",
        "train.max_steps=10",
        "--set",
        "eval.every_steps=5",
        "--set",
        f"eval.target_loss={target}",
    )
    (run,) = _ids(ws) - before
    return run


@pytest.fixture(scope="module")
def tiny_reached(workspace) -> str:
    return _tiny(workspace, 100.0)  # confirmed by the first evaluation


@pytest.fixture(scope="module")
def tiny_not_reached(workspace) -> str:
    return _tiny(workspace, 0.5)  # far below what 10 updates can do


def _official_checker(path: Path, log: Path) -> subprocess.CompletedProcess:
    args = ["--werror", "--config", str(RULES), "--log_output", str(log), str(path)]
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_real_reached_run_exports_a_compliant_log(workspace, tiny_reached, tmp_path):
    out = tmp_path / "reached.txt"
    proc = ledgerlm(
        "ledger", "export-mllog", tiny_reached, "-o", str(out), "--check", "-w", str(workspace)
    )
    assert "run_stop status success" in proc.stdout
    assert "compliance check passed" in proc.stdout
    records = read(out)
    (stop,) = keyed(records, "run_stop")
    assert stop["metadata"]["status"] == "success"
    assert stop["metadata"]["ledger_devices"] == 1  # one process: one device, its wall
    device = stop["metadata"]["ledger_device_seconds_to_target"]
    assert device == pytest.approx(stop["metadata"]["ledger_time_to_target_s"]) and device > 0
    assert keyed(records, "eval_accuracy")[-1]["value"] <= 100.0
    assert keyed(records, "max_steps")[0]["value"] == 10
    ok = _official_checker(out, tmp_path / "cc.log")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = write(tmp_path / "broken.txt", _drop_first("run_stop")(records))
    bad = _official_checker(broken, tmp_path / "cc2.log")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "run_stop" in bad.stderr


def test_a_real_run_below_target_exports_an_aborted_log(workspace, tiny_not_reached, tmp_path):
    proc = ledgerlm("ledger", "export-mllog", tiny_not_reached, "-w", str(workspace))
    default = workspace / "runs" / tiny_not_reached / "mllog.txt"
    assert str(default) in proc.stdout
    assert "run_stop status aborted" in proc.stdout
    assert check_mllog(default) == []
    records = read(default)
    assert [a["metadata"]["epoch_num"] for a in keyed(records, "eval_accuracy")] == [5, 10]
    (stop,) = keyed(records, "run_stop")
    assert stop["metadata"]["status"] == "aborted"
    ok = _official_checker(default, tmp_path / "cc.log")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The same log claiming success must fail: no accuracy met the target.
    lie = _edit_last("run_stop", lambda r: r["metadata"].update(status="success"))(records)
    assert _official_checker(write(tmp_path / "lie.txt", lie), tmp_path / "cc2.log").returncode
