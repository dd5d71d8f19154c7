"""The sinks without training: names, the fan-out that drops a failing sink, each real
library read back with its own reader, a missing library, and the replay of a ledger run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from e2e.test_sinks import sink_env, wandb_history, wandb_records
from ledgerlm.config import Recipe
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.sinks import export_run, open_sinks, replay
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.sinks import (
    MLflowSink,
    SinkError,
    TensorBoardSink,
    WandbSink,
    evaluation_scalars,
    flat_params,
    step_scalars,
)
from ledgerlm.workspace import Workspace

ROWS = [
    {"step": s, "tokens": 1000 + s, "targets": 990, "loss": 6.0 - 0.25 * s,
     "grad_norm": 1.0 / s, "lr": 1e-3 * s, "seconds": 0.5}
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

    def log_params(self, params: dict) -> None:
        self.params = params

    def log_step(self, row: dict) -> None:
        self.steps.append(dict(row))

    def log_evaluation(self, record: dict) -> None:
        self.evaluations.append(record)

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


def _recorder(tmp_path: Path) -> tuple[Ledger, LedgerRecorder]:
    ledger = Ledger(tmp_path / "ledger.db")
    run_id = ledger.create_run("unit", RECIPE, target_metric="loss", target_value=1.0,
                               eval_every=3)  # fmt: skip
    return ledger, LedgerRecorder(ledger, run_id, flush_every=3)


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
    ledger, recorder = _recorder(tmp_path)
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
    # the others saw exactly what the ledger holds: every row, every evaluation
    ledger_steps = ledger.steps(recorder.run_id)
    assert keeping.steps == ledger_steps and len(keeping.steps) == len(ROWS)
    assert [e["step"] for e in keeping.evaluations] == [3, 6]
    assert keeping.params == RECIPE and keeping.closed == "not reached"
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
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # what `import` finds for a missing one
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


def test_tensorboard_sink_reads_back(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    _send(sink)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {
        "train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s",
        "val/loss", "val_domain/loss/code", "val/bpb",
    }  # fmt: skip
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in ROWS], rel=1e-6)
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 6]
    assert "recipe/text_summary" in acc.Tags()["tensors"]


def test_mlflow_sink_reads_back_and_a_live_copy_continues_its_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    first = MLflowSink("unit-run", uri=uri, experiment="lab")
    _send(first)
    first.close("failed")
    again = MLflowSink("unit-run", uri=uri, experiment="lab")  # a resumed run's live copy
    assert again.mlflow_run_id == first.mlflow_run_id
    again.close("reached")
    export = MLflowSink("unit-run", uri=uri, experiment="lab", resume=False)
    assert export.mlflow_run_id != first.mlflow_run_id
    export.close("reached")

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


def _seeded(tmp_path: Path) -> tuple[Ledger, str]:
    ledger = Ledger(tmp_path / "ledger.db")
    run_id = ledger.create_run("seeded", RECIPE, target_metric="loss", target_value=1.0,
                               eval_every=3)  # fmt: skip
    ledger.add_steps(run_id, ROWS)
    for e in reversed(EVALS):  # stored in any order, replayed in step order
        ledger.add_evaluation(run_id, phase_id=None, **e)
    ledger.finish_run(run_id, "not reached")
    return ledger, run_id


def test_replay_sends_the_ledger_in_step_order(tmp_path):
    ledger, run_id = _seeded(tmp_path)
    keeping = Keeping()
    assert replay(ledger, run_id, keeping) == {"steps": 6, "evaluations": 2}
    assert keeping.params == RECIPE and keeping.steps == ledger.steps(run_id)
    assert [e["step"] for e in keeping.evaluations] == [3, 6]
    ledger.close()


def test_export_run_to_tensorboard_and_its_faults(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'ledgerlm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ledger, run_id = _seeded(tmp_path)
    ws = Workspace(tmp_path)
    result = export_run(ledger, ws, "seeded", "tensorboard", str(tmp_path / "tb"))
    assert result == {"run": run_id, "sink": "tensorboard", "where": str(tmp_path / "tb" / run_id),
                      "status": "not reached", "steps": 6, "evaluations": 2}  # fmt: skip
    acc = EventAccumulator(result["where"])
    acc.Reload()
    assert len(acc.Scalars("train/lr")) == 6 and len(acc.Scalars("val/bpb")) == 2
    with pytest.raises(SinkError, match="needs a folder"):
        export_run(ledger, ws, run_id, "tensorboard")
    (tmp_path / "file").write_text("")
    with pytest.raises(SinkError, match=r"^tensorboard: NotADirectoryError: "):
        export_run(ledger, ws, run_id, "tensorboard", str(tmp_path / "file"))
    with pytest.raises(SinkError, match="unknown sink 'csv'"):
        export_run(ledger, ws, run_id, "csv", str(tmp_path))
    ledger.close()
