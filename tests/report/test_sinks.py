"""The sinks without training: names, the fan-out that drops a failing sink (and says
so), each real library read back with its own reader, a missing library, and the replay
of a ledger run at the times the ledger holds, twice into the same MLflow and W&B run.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from e2e.test_sinks import float32, sink_env, wandb_history, wandb_records
from ledgerlm.config import Recipe
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.sinks import open_sinks, replay, replay_to_sinks
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.sinks import (
    MLflowSink,
    SinkError,
    TensorBoardSink,
    WandbSink,
    check_sink,
    evaluation_scalars,
    flat_params,
    step_scalars,
)
from ledgerlm.workspace import Workspace

T0 = 1_700_000_000.0  # the run trained long before any test exports it
ROWS = [
    {"step": s, "tokens": 1000 + s, "targets": 990, "loss": 6.0 - 0.25 * s,
     "grad_norm": 1.0 / s, "lr": 1e-3 * s, "seconds": 0.5, "at": T0 + 10 + 0.5 * s}
    for s in range(1, 7)
]  # fmt: skip
EVALS = [
    {"step": s, "tokens": 1000 * s, "targets": 990 * s, "updates": s, "snapshot": f"w{s}",
     "metrics": {"loss": 5.0 - 0.1 * s, "loss/code": 4.5, "bpb": 3.0, "nats_per_char": None}}
    for s in (3, 6)
]  # fmt: skip
RECIPE = {"name": "unit", "train": {"lr": 0.003, "max_steps": 6}, "log": {"sinks": []}}


class Keeping:
    """A sink that keeps what it is sent (the fan-out's contract, no library)."""

    name = "keeping"
    where = "memory"

    def __init__(self) -> None:
        self.params: dict = {}
        self.steps: list[dict] = []
        self.evaluations: list[dict] = []
        self.flushes, self.closed = 0, None
        self.summary: tuple[dict, int] | None = None

    def log_params(self, params: dict) -> None:
        self.params = params

    def log_step(self, row: dict) -> None:
        self.steps.append(dict(row))

    def log_evaluation(self, record: dict) -> None:
        self.evaluations.append(record)

    def log_summary(self, values: dict, step: int, at: float | None) -> None:
        self.summary = (values, step)

    def flush(self) -> None:
        self.flushes += 1

    def close(self, status: str = "reached") -> None:
        self.closed = status


class Breaking(Keeping):
    """A sink that breaks at its third row, as a full disk or a dropped connection would."""

    name = "breaking"

    def log_step(self, row: dict) -> None:
        if len(self.steps) == 2:
            raise ConnectionError("the dashboard went away\nwhile logging")
        super().log_step(row)


def test_the_names_are_the_same_in_every_sink():
    assert step_scalars(ROWS[0]) == {
        "train/loss": 5.75, "train/grad_norm": 1.0, "train/lr": 1e-3,
        "train/tokens_per_s": 2002.0,
    }  # fmt: skip
    assert "train/tokens_per_s" not in step_scalars({**ROWS[0], "seconds": None})
    assert evaluation_scalars(EVALS[0]) == {
        "val/loss": pytest.approx(4.7),
        "val_domain/loss/code": 4.5,
        "val/bpb": 3.0,
    }  # the null metric is left out; a per-domain one never sits under an overall one
    assert flat_params({"name": "x", "train": {"lr": 0.003, "sources": ["a"], "none": None}}) == {
        "name": "x", "train.lr": "0.003", "train.sources": '["a"]', "train.none": "null",
    }  # fmt: skip


def _recorder(tmp_path: Path, notes: list[str] | None = None) -> tuple[Ledger, LedgerRecorder]:
    ledger = Ledger(tmp_path / "ledger.db")
    run_id = ledger.create_run("unit", RECIPE, target_metric="loss", target_value=1.0,
                               eval_every=3)  # fmt: skip
    note = None if notes is None else notes.append
    return ledger, LedgerRecorder(ledger, run_id, flush_every=3, note=note)


def _train(recorder: LedgerRecorder) -> None:
    """What the trainer reports for ROWS and EVALS, without a model."""
    state = SimpleNamespace(step=0, tokens=0, targets=0, loss=0.0, grad_norm=0.0, lr=0.0)
    trainer = SimpleNamespace(state=state)
    recorder.start("train", 0)
    recorder.on_train_start(trainer)
    for row in ROWS:
        state.step, state.loss, state.grad_norm, state.lr = (
            row["step"], row["loss"], row["grad_norm"], row["lr"]
        )  # fmt: skip
        state.tokens += row["tokens"]
        state.targets += row["targets"]
        recorder.on_step_end(trainer)
        for e in EVALS:
            if e["step"] == row["step"]:
                recorder.evaluation(e, SimpleNamespace(id=None), {"tokens": state.tokens})
    recorder.on_train_end(trainer)
    recorder.stop(state.step)


def test_a_failing_sink_is_one_event_and_dropped_while_the_others_get_everything(tmp_path):
    notes: list[str] = []
    ledger, recorder = _recorder(tmp_path, notes)
    keeping, breaking = Keeping(), Breaking()
    recorder.sinks.open("keeping", lambda: keeping)
    recorder.sinks.open("breaking", lambda: breaking)

    def refuse() -> Any:
        raise PermissionError("no token")

    recorder.sinks.open("refusing", refuse)
    recorder.sinks.log_params(RECIPE)
    _train(recorder)
    ledger.finish_run(recorder.run_id, "not reached")
    recorder.close()
    recorder.close()  # once is enough; again is nothing

    summary = ledger.run_summary(recorder.run_id)
    failed = [e for e in summary["events"] if e["kind"] == "sink_failed"]
    assert [e["message"] for e in failed] == [
        "refusing: PermissionError: no token",
        "breaking: ConnectionError: the dashboard went away while logging",
    ]
    assert failed[1]["step"] is not None
    # and one warning line each for the user, as it happens
    assert len(notes) == 2 and all("\n" not in line for line in notes)
    assert notes[0].startswith("warning: refusing: PermissionError: no token; ")
    assert notes[1].startswith(f"warning: {failed[1]['message']}; ")
    assert f"dropped at step {failed[1]['step']}" in notes[1]
    assert f"ledgerlm ledger export {recorder.run_id} --to breaking" in notes[1]
    # the others saw exactly what the ledger holds: every row, every evaluation
    ledger_steps = ledger.steps(recorder.run_id)
    assert keeping.steps == ledger_steps and len(keeping.steps) == len(ROWS)
    assert [e["step"] for e in keeping.evaluations] == [3, 6]
    assert keeping.params == RECIPE and keeping.closed == "not reached"
    # and, before it closed, the run's bill: wall and device seconds (one device here)
    values, step = keeping.summary
    assert step == 6 and values == {
        "ledger/wall_seconds": pytest.approx(summary["total_seconds"]),
        "ledger/device_seconds": pytest.approx(summary["device_seconds"]),
    }  # not reached: no time-to-target
    assert breaking.closed is None and len(breaking.steps) == 2  # dropped, never called again
    (spent,) = [json.loads(e["message"]) for e in summary["events"] if e["kind"] == "sinks"]
    assert set(spent["seconds"]) == {"keeping", "breaking", "refusing"}
    ledger.close()


def test_rows_reach_the_sinks_only_once_they_are_in_the_ledger(tmp_path):
    ledger, recorder = _recorder(tmp_path)
    keeping = recorder.sinks.open("keeping", Keeping)
    state = SimpleNamespace(step=0, tokens=0, targets=0, loss=1.0, grad_norm=1.0, lr=1.0)
    trainer = SimpleNamespace(state=state)
    recorder.start("train", 0)
    recorder.on_train_start(trainer)
    seen = []
    for step in (1, 2, 3, 4):
        state.step = step
        recorder.on_step_end(trainer)
        assert keeping.steps == ledger.steps(recorder.run_id)
        seen.append(len(keeping.steps))
    assert seen == [1, 1, 1, 4]  # the first update of a phase, then every 3
    recorder.stop(4)
    ledger.close()


@pytest.mark.parametrize(
    ("kind", "module", "make"),
    [
        ("tensorboard", "torch.utils.tensorboard", lambda p: TensorBoardSink(p)),
        ("mlflow", "mlflow", lambda p: MLflowSink("r", uri=p.as_uri())),
        ("wandb", "wandb", lambda p: WandbSink("r", folder=p, mode="offline")),
    ],
)
def test_a_missing_library_names_the_extra(kind, module, make, tmp_path, monkeypatch):
    check_sink(kind)  # installed here: nothing to say
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # what `import` finds for a missing one
    monkeypatch.setitem(sys.modules, kind, None)  # the package itself (tensorboard's too)
    package = {"mlflow": "mlflow-skinny"}.get(kind, kind)
    with pytest.raises(SinkError) as refused:
        check_sink(kind)
    assert str(refused.value) == (
        f"log.sinks: {kind} needs the {package} package: pip install 'ledgerlm[{kind}]'"
    )
    with pytest.raises(SinkError, match=rf"^--to: {kind} needs the "):
        check_sink(kind, "--to")
    with pytest.raises(SinkError, match=rf"pip install 'ledgerlm\[{kind}\]'"):
        make(tmp_path)
    # and a run with it configured records that, then trains on
    ledger, recorder = _recorder(tmp_path)
    recipe = Recipe.model_validate({"log": {"sinks": [kind], "mlflow_uri": tmp_path.as_uri()}})
    open_sinks(recorder, recipe, tmp_path / "run")
    (failed,) = [e for e in ledger.run_summary(recorder.run_id)["events"]]
    assert (
        failed["kind"] == "sink_failed" and f"pip install 'ledgerlm[{kind}]'" in failed["message"]
    )
    assert len(recorder.sinks) == 0
    ledger.close()


def _send(sink: Any) -> None:
    sink.log_params(RECIPE)
    for row in ROWS:
        sink.log_step(row)
    for record in EVALS:
        sink.log_evaluation(record)
    sink.flush()


def tensorboard_read_back(folder: Path, send: Callable[[Any], None]) -> Any:
    """What ``send`` gives a TensorBoard sink writing to ``folder``, read back by
    TensorBoard's own reader (an ``EventAccumulator``); skipped without the extra."""
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(folder)
    send(sink)
    sink.close()
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return acc


def mlflow_uri(folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The URI of an MLflow file store in ``folder`` (which MLflow allows only when
    told to); skipped without the extra."""
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (folder / "mlruns").as_uri()


def test_tensorboard_sink_reads_back(tmp_path):
    acc = tensorboard_read_back(tmp_path / "tb", _send)
    assert set(acc.Tags()["scalars"]) == {
        "train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s",
        "val/loss", "val_domain/loss/code", "val/bpb",
    }  # fmt: skip
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in loss] == float32([r["loss"] for r in ROWS])
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 6]
    assert "recipe/text_summary" in acc.Tags()["tensors"]


def test_mlflow_sink_reads_back_and_a_live_copy_continues_its_run(tmp_path, monkeypatch):
    uri = mlflow_uri(tmp_path, monkeypatch)
    from mlflow.tracking import MlflowClient

    first = MLflowSink("unit-run", uri=uri, experiment="lab")
    _send(first)
    first.close("failed")
    again = MLflowSink("unit-run", uri=uri, experiment="lab")  # a resumed run's live copy
    assert again.mlflow_run_id == first.mlflow_run_id
    again.close("reached")
    export = MLflowSink("unit-run", uri=uri, experiment="lab", source="export")
    assert export.mlflow_run_id != first.mlflow_run_id
    export.close("reached")
    again = MLflowSink("unit-run", uri=uri, experiment="lab", source="export")
    assert again.mlflow_run_id == export.mlflow_run_id  # a second export: the same run
    again.close("reached")

    client = MlflowClient(uri)
    run = client.get_run(first.mlflow_run_id)
    assert run.info.run_name == "unit-run" and run.info.status == "FINISHED"
    assert run.data.tags["ledgerlm.run_id"] == "unit-run"
    assert run.data.params == {"name": "unit", "train.lr": "0.003", "train.max_steps": "6",
                               "log.sinks": "[]"}  # fmt: skip
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["loss"]) for r in ROWS]
    val = client.get_metric_history(run.info.run_id, "val_domain/loss/code")
    assert [(m.step, m.value) for m in val] == [(3, 4.5), (6, 4.5)]


def test_wandb_sink_reads_back_offline(tmp_path):
    pytest.importorskip("wandb", reason="pip install 'ledgerlm[wandb]'")
    with sink_env(tmp_path):
        sink = WandbSink("unit-run", project="lab", folder=tmp_path / "wb", mode="offline")
        _send(sink)
        sink.close("failed")
    folder = Path(sink.where)
    assert folder.parent == tmp_path / "wb" / "wandb" and folder.name.endswith("-unit-run")
    records = wandb_records(folder / "run-unit-run.wandb")
    history = wandb_history(records)
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6, 3, 6]  # sent out of order
    assert [h["train/loss"] for h in history[:6]] == [r["loss"] for r in ROWS]
    assert history[6]["val_domain/loss/code"] == 4.5 and "val/nats_per_char" not in history[6]
    steps = {m.metric.glob_name: m.metric.step_metric for m in records if m.HasField("metric")}
    assert steps["train/*"] == steps["val/*"] == steps["val_domain/*"] == "step"
    (exit_record,) = [r.exit for r in records if r.HasField("exit")]
    assert exit_record.exit_code == 1  # the ledger run failed


def _seeded(tmp_path: Path, rows: list[dict] = ROWS) -> tuple[Ledger, str]:
    """A run that trained at T0, long before the export: created at T0, one train phase
    holding its 6 updates (T0 + 10 to T0 + 13), each evaluation just after its update."""
    ledger = Ledger(tmp_path / "ledger.db")
    run_id = ledger.create_run("seeded", RECIPE, target_metric="loss", target_value=1.0,
                               eval_every=3)  # fmt: skip
    ledger.add_steps(run_id, rows)
    for e in reversed(EVALS):  # stored in any order, replayed in step order
        ledger.add_evaluation(run_id, phase_id=None, **e)
    ledger.finish_run(run_id, "not reached")
    with sqlite3.connect(tmp_path / "ledger.db") as conn:  # the times of a run of the past
        conn.execute("UPDATE runs SET created_at = ? WHERE id = ?", (T0, run_id))
        conn.execute(
            "INSERT INTO phases(run_id, kind, started_at, ended_at, seconds, step_start,"
            " step_end, detail_json) VALUES (?, 'train', ?, ?, 3.0, 0, 6, '{}')",
            (run_id, T0 + 10, T0 + 13),
        )
        for e in EVALS:
            conn.execute(
                "UPDATE evaluations SET created_at = ? WHERE run_id = ? AND step = ?",
                (_eval_at(e["step"]), run_id, e["step"]),
            )
    return ledger, run_id


def _eval_at(step: int) -> float:
    return T0 + 10 + 0.5 * step + 0.25


def test_replay_sends_the_ledger_in_step_order(tmp_path):
    ledger, run_id = _seeded(tmp_path)
    keeping = Keeping()
    assert replay(ledger, run_id, keeping) == {"steps": 6, "evaluations": 2}
    assert keeping.params == RECIPE and keeping.steps == ledger.steps(run_id)
    assert [e["step"] for e in keeping.evaluations] == [3, 6]
    ledger.close()


def test_replay_to_sinks_tensorboard_and_its_faults(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ledger, run_id = _seeded(tmp_path)
    ws = Workspace(tmp_path)
    result = replay_to_sinks(ledger, ws, "seeded", "tensorboard", str(tmp_path / "tb"))
    where = str(tmp_path / "tb" / run_id)
    assert result == {"run": run_id, "sink": "tensorboard", "where": where,
                      "view": f"tensorboard --logdir {where}", "status": "not reached",
                      "steps": 6, "evaluations": 2}  # fmt: skip
    acc = EventAccumulator(result["where"])
    acc.Reload()
    assert len(acc.Scalars("train/lr")) == 6 and len(acc.Scalars("val/bpb")) == 2
    # every point at its time in the ledger, not at the export's
    for tag in ("train/loss", "train/lr", "train/tokens_per_s"):
        assert [e.wall_time for e in acc.Scalars(tag)] == [r["at"] for r in ROWS]
    assert [e.wall_time for e in acc.Scalars("val/loss")] == [_eval_at(3), _eval_at(6)]
    with pytest.raises(SinkError, match="needs a folder"):
        replay_to_sinks(ledger, ws, run_id, "tensorboard")
    (tmp_path / "file").write_text("")
    with pytest.raises(SinkError, match=r"^tensorboard: NotADirectoryError: "):
        replay_to_sinks(ledger, ws, run_id, "tensorboard", str(tmp_path / "file"))
    with pytest.raises(SinkError, match="unknown sink 'csv'"):
        replay_to_sinks(ledger, ws, run_id, "csv", str(tmp_path))
    ledger.close()


def test_rows_of_an_older_ledger_are_replayed_at_their_place_in_the_train_phase(tmp_path):
    """A ledger written before updates kept their end time (schema 4): each update is
    placed in its train phase by the seconds of the updates before it."""
    ledger, run_id = _seeded(tmp_path, [{k: v for k, v in r.items() if k != "at"} for r in ROWS])
    assert {r["at"] for r in ledger.steps(run_id)} == {None}
    keeping = Keeping()
    replay(ledger, run_id, keeping)
    assert [r["at"] for r in keeping.steps] == pytest.approx([r["at"] for r in ROWS])
    ledger.close()


def test_a_second_mlflow_export_updates_its_run_at_the_ledger_times(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    ledger, run_id = _seeded(tmp_path)
    uri = (tmp_path / "mlruns").as_uri()
    first = replay_to_sinks(ledger, Workspace(tmp_path), run_id, "mlflow", uri)
    second = replay_to_sinks(ledger, Workspace(tmp_path), run_id, "mlflow", uri)
    assert first["where"] == second["where"] and first["steps"] == second["steps"] == 6
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ledgerlm").experiment_id])
    assert run.data.tags["ledgerlm.run_id"] == run_id and run.info.status == "FINISHED"
    # the ledger run's span: created at T0, its last phase ended at T0 + 13
    assert (run.info.start_time, run.info.end_time) == (1000 * T0, 1000 * (T0 + 13))
    for key in ("train/loss", "train/grad_norm"):
        history = client.get_metric_history(run.info.run_id, key)  # each point once
        assert [(m.step, m.timestamp) for m in history] == [
            (r["step"], round(1000 * r["at"])) for r in ROWS
        ]
    val = client.get_metric_history(run.info.run_id, "val/loss")
    assert [m.timestamp for m in val] == [round(1000 * _eval_at(s)) for s in (3, 6)]
    ledger.close()


def test_a_second_wandb_export_is_the_same_run_at_the_ledger_times(tmp_path):
    pytest.importorskip("wandb", reason="pip install 'ledgerlm[wandb]'")
    ledger, run_id = _seeded(tmp_path)
    wb = tmp_path / "wb"
    with sink_env(tmp_path):
        done = [
            replay_to_sinks(ledger, Workspace(tmp_path), run_id, "wandb", str(wb)) for _ in "12"
        ]
    ledger.close()
    ids = set()
    for result in done:
        folder = Path(result["where"])
        assert result["view"] == f"wandb sync {folder}"
        records = wandb_records(folder / f"run-{run_id}-export.wandb")
        ids |= {r.run.run_id for r in records if r.HasField("run")}
        history = wandb_history(records)
        train = [h for h in history if "train/loss" in h]
        assert [h["_timestamp"] for h in train] == [r["at"] for r in ROWS]
        val = [h for h in history if "val/loss" in h]
        assert [h["_timestamp"] for h in val] == [_eval_at(3), _eval_at(6)]
    assert ids == {f"{run_id}-export"}  # one W&B run: a sync updates it, never a second
