"""Sinks fed by the ledger, end to end through the console script: a tiny run copied
live into TensorBoard, MLflow (a file store in tmp) and W&B (offline), each read back
with the library's own reader and compared with the ledger, the run saying where each
copy goes; ``ledger export`` replaying the run after the fact at the ledger's times,
twice into the same MLflow and W&B run; a sink whose library is missing refused before
anything is written; sinks that fail, and a run that fails, never losing the ledger.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cli_runner import ledgerlm_without
from ledgerlm.ledger.store import Ledger

from .conftest import TINY, ledgerlm

SINKS = '["tensorboard","mlflow","wandb"]'
SHORT = ["--set", "train.max_steps=4", "--set", "eval.every_steps=2"]


@contextmanager
def sink_env(root: Path) -> Iterator[None]:
    """MLflow's file store allowed, W&B quiet and offline, both kept inside ``root``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_MODE", "offline")
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(root / "wandb-home" / var.lower()))
        yield


def ledger_of(ws: Path, run_id: str) -> tuple[list[dict], dict]:
    with Ledger(ws / "ledger.db") as ledger:
        return ledger.steps(run_id), ledger.run_summary(run_id)


def wandb_records(path: Path, wait: float = 20.0) -> list[Any]:
    """The records of a ``.wandb`` file, parsed with W&B's own protobuf ``Record``, once
    it holds the run's ``exit`` record: W&B's own process writes the file, and
    ``run.finish()`` in offline mode may return before it has (waits up to ``wait`` s).
    """
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + wait
    while True:
        try:
            records = _read_wandb(path)
            if any(r.WhichOneof("record_type") == "exit" for r in records):
                return records
        except DecodeError:  # a record half-written
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _read_wandb(path: Path) -> list[Any]:
    """The file is a LevelDB-style log (W&B's ``datastore``: a 7-byte ``:W&B`` header, then
    32 KiB blocks of chunks, each with a 7-byte header: CRC, length, type full/first/
    middle/last); wandb ships no Python reader for it any more, only the message types."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero fill up to the next block
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(records: list[Any]) -> list[dict[str, Any]]:
    """Each ``run.log`` row of the records, values decoded from JSON."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
        for h in (r.history for r in records if r.WhichOneof("record_type") == "history")
    ]


def events(summary: dict, kind: str) -> list[dict]:
    return [e for e in summary["events"] if e["kind"] == kind]


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict[str, Any]:
    """One tiny run (4 updates, an evaluation every 2) with all three sinks."""
    root = tmp_path_factory.mktemp("sinks")
    ws, mlruns = root / "ws", root / "mlruns"
    with sink_env(root):
        proc = ledgerlm(
            "run", str(TINY), "-w", str(ws), *SHORT,
            "--set", f"log.sinks={SINKS}",
            "--set", f"log.mlflow_uri={mlruns.as_uri()}",
            "--set", "log.wandb_mode=offline",
        )  # fmt: skip
    with Ledger(ws / "ledger.db") as ledger:
        run_id = ledger.resolve_run("latest")
    steps, summary = ledger_of(ws, run_id)
    return {"root": root, "ws": ws, "run": run_id, "mlruns": mlruns, "steps": steps,
            "summary": summary, "stderr": proc.stderr}  # fmt: skip


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _walltimes(folder: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [e.wall_time for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def float32(values: list[float]) -> list[float]:
    """``values`` as a TensorBoard scalar holds them: rounded to float32."""
    return [struct.unpack("f", struct.pack("f", v))[0] for v in values]


def _check_scalars(scalars: dict, steps: list[dict], evaluations: list[dict]) -> None:
    """TensorBoard's points are the ledger's, rounded to float32: exactly (the sinks are
    sent the rows the ledger holds)."""
    assert {"train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s", "val/loss",
            "val/bpb", "val_domain/loss/code"} <= set(scalars)  # fmt: skip
    assert len(scalars["train/loss"]) == len(steps) == 4
    for tag, key in (("train/loss", "loss"), ("train/grad_norm", "grad_norm"), ("train/lr", "lr")):
        assert [s for s, _ in scalars[tag]] == [r["step"] for r in steps]
        assert [v for _, v in scalars[tag]] == float32([r[key] for r in steps])
    rates = [r["tokens"] / r["seconds"] for r in steps]
    assert [v for _, v in scalars["train/tokens_per_s"]] == float32(rates)
    assert [s for s, _ in scalars["val/loss"]] == [e["step"] for e in evaluations] == [2, 4]
    for tag, key in (("val/loss", "loss"), ("val_domain/loss/code", "loss/code")):
        values = [e["metrics"][key] for e in evaluations]
        assert [v for _, v in scalars[tag]] == float32(values)


def test_the_run_says_where_each_copy_goes(live):
    lines = live["stderr"].splitlines()
    logs = live["ws"] / "runs" / live["run"] / "logs"
    assert f"tensorboard sink: {logs}" in lines
    assert f"tensorboard --logdir {logs}" in lines  # what to type to see it
    (mlflow,) = [line for line in lines if line.startswith("mlflow sink: ")]
    assert mlflow.startswith(f"mlflow sink: {live['mlruns'].as_uri()} (experiment ledgerlm, run ")
    (folder,) = (logs / "wandb").glob(f"offline-run-*-{live['run']}")
    assert f"wandb sink: {folder}" in lines and f"wandb sync {folder}" in lines
    assert not [line for line in lines if line.startswith("warning")]


def test_tensorboard_holds_every_update_and_evaluation_of_the_ledger(live):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    logs = live["ws"] / "runs" / live["run"] / "logs"
    assert list(logs.glob("events.out.tfevents.*"))
    _check_scalars(_scalars(logs), live["steps"], live["summary"]["evaluations"])
    walltimes = _walltimes(logs)
    assert walltimes["train/loss"] == [r["at"] for r in live["steps"]]
    # the run's bill, sent as it closed: wall and device seconds at its last step
    scalars, summary = _scalars(logs), live["summary"]
    assert scalars["ledger/wall_seconds"] == [(4, *float32([summary["total_seconds"]]))]
    assert scalars["ledger/device_seconds"] == [(4, *float32([summary["device_seconds"]]))]
    assert not events(live["summary"], "sink_failed")
    (spent,) = events(live["summary"], "sinks")
    assert set(json.loads(spent["message"])["seconds"]) == {"tensorboard", "mlflow", "wandb"}


def test_mlflow_holds_a_run_named_by_the_ledger_run(live, monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the file store back
    client = MlflowClient(live["mlruns"].as_uri())
    experiment = client.get_experiment_by_name("ledgerlm")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == live["run"] and run.info.status == "FINISHED"
    assert run.data.tags["ledgerlm.status"] == live["summary"]["run"]["status"]
    assert run.data.params["train.max_steps"] == "4" and run.data.params["name"] == "tiny"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [r["step"] for r in live["steps"]]
    # MLflow and W&B keep float64: the ledger's values, exactly
    assert [m.value for m in history] == [r["loss"] for r in live["steps"]]
    val = client.get_metric_history(run.info.run_id, "val_domain/bpb/math")
    evaluations = live["summary"]["evaluations"]
    assert [m.value for m in val] == [e["metrics"]["bpb/math"] for e in evaluations]
    assert run.data.metrics["ledger/device_seconds"] == live["summary"]["device_seconds"]


def test_wandb_offline_run_holds_the_history_and_the_recipe(live):
    pytest.importorskip("wandb", reason="pip install 'ledgerlm[wandb]'")
    logs = live["ws"] / "runs" / live["run"] / "logs" / "wandb"
    (folder,) = logs.glob(f"offline-run-*-{live['run']}")
    records = wandb_records(folder / f"run-{live['run']}.wandb")
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == live["run"] and run.display_name == live["run"]
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
    }
    assert config["train"]["max_steps"] == 4 and config["name"] == "tiny"
    history = wandb_history(records)
    train = [h for h in history if "train/loss" in h]
    assert [h["step"] for h in train] == [r["step"] for r in live["steps"]]
    assert [h["train/loss"] for h in train] == [r["loss"] for r in live["steps"]]
    val = [h for h in history if "val/loss" in h]
    evaluations = live["summary"]["evaluations"]
    assert [h["step"] for h in val] == [e["step"] for e in evaluations]
    assert [h["val/loss"] for h in val] == [e["metrics"]["loss"] for e in evaluations]
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0


def test_ledger_export_replays_the_run_into_tensorboard(live, tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    out = ledgerlm("ledger", "export", live["run"][-9:], "--to", "tensorboard", str(tmp_path),
                   "-w", str(live["ws"]))  # fmt: skip
    assert f"4 updates and 2 evaluations of run {live['run']}" in out.stdout
    assert f"tensorboard --logdir {tmp_path / live['run']}" in out.stdout.splitlines()
    exported = _scalars(tmp_path / live["run"])
    _check_scalars(exported, live["steps"], live["summary"]["evaluations"])
    assert exported == _scalars(live["ws"] / "runs" / live["run"] / "logs")  # the live copy
    # at the times of the training, not of the export
    walltimes = _walltimes(tmp_path / live["run"])
    for tag in ("train/loss", "train/lr", "train/tokens_per_s"):
        assert walltimes[tag] == [r["at"] for r in live["steps"]]
    evaluated = [e["created_at"] for e in live["summary"]["evaluations"]]
    assert walltimes["val/loss"] == walltimes["val_domain/loss/code"] == evaluated
    assert walltimes["val/loss"][-1] > walltimes["train/loss"][-1]  # after the last update


def test_ledger_export_replays_the_run_into_mlflow_and_wandb(live, tmp_path):
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    pytest.importorskip("wandb", reason="pip install 'ledgerlm[wandb]'")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    with sink_env(tmp_path):
        ws = ["-w", str(live["ws"]), "--json"]
        wb = str(tmp_path / "wb")
        to_mlflow, to_wandb = (
            [
                json.loads(ledgerlm("ledger", "export", live["run"], dest, "--to", to, *ws).stdout)
                for _ in "12"  # twice: the second updates the first's copy
            ]
            for dest, to in ((uri, "mlflow"), (wb, "wandb"))
        )
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("ledgerlm").experiment_id])
    assert to_mlflow[0]["steps"] == 4 and to_mlflow[0]["evaluations"] == 2
    assert to_mlflow[0]["where"] == to_mlflow[1]["where"]
    assert run.info.run_name == live["run"] and run.data.tags["ledgerlm.source"] == "export"
    history = client.get_metric_history(run.info.run_id, "train/lr")  # each point once
    assert [m.value for m in history] == [r["lr"] for r in live["steps"]]
    assert [m.timestamp for m in history] == [round(1000 * r["at"]) for r in live["steps"]]
    phases = live["summary"]["phases"]
    assert run.info.start_time == round(1000 * phases[0]["started_at"])  # the start-up's
    assert run.info.end_time == round(1000 * max(p["ended_at"] for p in phases))
    folders = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert [r["where"] for r in to_wandb] == [str(f) for f in folders]
    ids = set()
    for folder in folders:
        (record,) = folder.glob("run-*.wandb")
        records = wandb_records(record)
        ids |= {r.run.run_id for r in records if r.WhichOneof("record_type") == "run"}
        history = wandb_history(records)
        train = [h for h in history if "train/grad_norm" in h]
        assert [h["train/grad_norm"] for h in train] == [r["grad_norm"] for r in live["steps"]]
        assert [h["_timestamp"] for h in train] == [r["at"] for r in live["steps"]]
        # steps in order, each evaluation after the update it follows
        assert [h["step"] for h in history] == [1, 2, 2, 3, 4, 4]
    assert ids == {f"{live['run']}-export"}  # one W&B run, whatever syncs it


def test_a_sink_that_cannot_open_is_an_event_and_training_goes_on(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the log folder should be")
    ws = tmp_path / "ws"
    proc = ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=2", "--set",
                    "eval.every_steps=2", "--set", 'log.sinks=["tensorboard"]',
                    "--set", f"log.dir={blocker}")  # fmt: skip
    with Ledger(ws / "ledger.db") as ledger:
        summary = ledger.run_summary(ledger.resolve_run("latest"))
    assert summary["run"]["status"] in ("reached", "not reached")
    assert summary["steps_recorded"]["updates"] == 2 and summary["evaluations"]
    (failed,) = events(summary, "sink_failed")
    assert failed["message"].startswith("tensorboard: NotADirectoryError: ")
    assert "\n" not in failed["message"] and str(blocker) in failed["message"]
    # said once on the console as it happened, and in ledger show's events
    (warning,) = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warning.startswith(f"warning: {failed['message']}; the tensorboard sink is dropped")
    shown = ledgerlm("ledger", "show", "latest", "-w", str(ws)).stdout.splitlines()
    assert shown[shown.index("events: 1 warning") + 1] == f"  sink_failed: {failed['message']}"


def test_the_sinks_of_a_failing_run_are_closed_with_what_the_ledger_holds(tmp_path):
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    from mlflow.tracking import MlflowClient

    ws, uri = tmp_path / "ws", (tmp_path / "mlruns").as_uri()
    with sink_env(tmp_path):
        proc = ledgerlm(
            "run", str(TINY), "-w", str(ws), "--set", "train.max_steps=20",
            "--set", "train.lr=1e30", "--set", "train.nonfinite=stop",
            "--set", 'log.sinks=["tensorboard","mlflow"]', "--set", f"log.mlflow_uri={uri}",
            check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and "non-finite" in proc.stderr
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("ledgerlm").experiment_id])
    with Ledger(ws / "ledger.db") as ledger:
        run_id = ledger.resolve_run("latest")
    steps, summary = ledger_of(ws, run_id)
    assert summary["run"]["status"] == "failed" and steps
    assert run.info.status == "FAILED" and run.data.tags["ledgerlm.status"] == "failed"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.value for m in history] == [r["loss"] for r in steps]
    scalars = _scalars(ws / "runs" / run_id / "logs")
    assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in steps]
    assert events(summary, "sinks")  # closed (and timed) after the error


BLOCKED = {
    "tensorboard": ("tensorboard", "torch.utils.tensorboard"),
    "mlflow": ("mlflow",),
    "wandb": ("wandb",),
}


def _refused(proc: Any, line: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [line] and not proc.stdout


@pytest.mark.parametrize("kind", sorted(BLOCKED))
def test_a_sink_whose_library_is_missing_is_refused_before_anything_is_written(kind, tmp_path):
    package = {"mlflow": "mlflow-skinny"}.get(kind, kind)
    needs = f"{kind} needs the {package} package: pip install 'ledgerlm[{kind}]'"
    ws = tmp_path / "ws"
    proc = ledgerlm_without(
        BLOCKED[kind], tmp_path, "run", str(TINY), "-w", str(ws), "--set", f'log.sinks=["{kind}"]'
    )  # fmt: skip
    _refused(proc, f"error: log.sinks: {needs}")
    assert not (ws / "ledger.db").exists() and not (ws / "runs").exists()  # no run, no folder
    # ledger export to it: the same line, nothing written
    with Ledger(ws / "ledger.db") as ledger:
        run_id = ledger.create_run("old", {}, target_metric="loss", target_value=1.0,
                                   eval_every=1)  # fmt: skip
    dest = tmp_path / "copy"
    proc = ledgerlm_without(
        BLOCKED[kind], tmp_path, "ledger", "export", run_id, str(dest), "--to", kind,
        "-w", str(ws),
    )  # fmt: skip
    _refused(proc, f"error: --to: {needs}")
    assert not dest.exists()
