"""Downstream task metrics in the sinks: their names in each backend (as the ledger
names them; for W&B, parts it can sort and filter), each real library read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.test_sinks import float32, sink_env, wandb_history, wandb_records
from ledgerlm.report.sinks import (
    MLflowSink,
    WandbSink,
    evaluation_scalars,
    wandb_key,
)
from report.task_ledger import accuracy
from report.test_sinks import mlflow_uri, tensorboard_read_back

TASK = accuracy("code-next-line", "acc", 30, 100) | accuracy("arith", "exact_match", 7, 20)
EVALS = [{"step": s, "metrics": {"loss": 5.0 - 0.1 * s, "loss/code": 4.5, **TASK}} for s in (3, 6)]
KEYS = sorted(TASK)


def _send(sink) -> None:
    for record in EVALS:
        sink.log_evaluation(record)
    sink.flush()


def test_task_keys_keep_their_ledger_names() -> None:
    scalars = evaluation_scalars(EVALS[0])
    assert {k for k in scalars if k.startswith("task/")} == set(TASK)
    assert scalars["task/code-next-line/acc_low"] == TASK["task/code-next-line/acc_low"]
    assert scalars["val_domain/loss/code"] == 4.5 and "val_domain/task/arith/items" not in scalars


def test_wandb_keys_are_letters_digits_and_underscores_between_slashes() -> None:
    assert wandb_key("task/code-next-line/acc_norm") == "task/code_next_line/acc_norm"
    assert wandb_key("task/v1.2/exact_match") == "task/v1_2/exact_match"
    assert wandb_key("task/3digits/acc") == "task/_3digits/acc"
    assert wandb_key("val_domain/loss/web-text") == "val_domain/loss/web_text"
    assert wandb_key("train/loss") == "train/loss"


def test_tensorboard_holds_every_task_key(tmp_path: Path) -> None:
    acc = tensorboard_read_back(tmp_path / "tb", _send)
    assert set(KEYS) <= set(acc.Tags()["scalars"])
    low = acc.Scalars("task/code-next-line/acc_low")
    assert [e.step for e in low] == [3, 6]
    assert [e.value for e in low] == float32([TASK["task/code-next-line/acc_low"]] * 2)


def test_mlflow_holds_every_task_key(tmp_path: Path, monkeypatch) -> None:
    uri = mlflow_uri(tmp_path, monkeypatch)
    from mlflow.tracking import MlflowClient

    sink = MLflowSink("task-run", uri=uri, experiment="lab")
    _send(sink)
    sink.close("reached")
    run = MlflowClient(uri).get_run(sink.mlflow_run_id)
    assert set(KEYS) <= set(run.data.metrics)
    history = MlflowClient(uri).get_metric_history(sink.mlflow_run_id, "task/arith/exact_match")
    assert [(m.step, m.value) for m in history] == [(3, 0.35), (6, 0.35)]


def test_wandb_holds_every_task_key_under_its_own_name(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="pip install 'ledgerlm[wandb]'")
    with sink_env(tmp_path):
        sink = WandbSink("task-run", project="lab", folder=tmp_path / "wb", mode="offline")
        _send(sink)
        sink.close("reached")
    records = wandb_records(Path(sink.where) / "run-task-run.wandb")
    history = wandb_history(records)
    assert [h["step"] for h in history] == [3, 6]
    assert {k for k in history[0] if k.startswith("task/")} == {wandb_key(k) for k in KEYS}
    assert history[0]["task/code_next_line/acc"] == pytest.approx(0.3)
    steps = {m.metric.glob_name: m.metric.step_metric for m in records if m.HasField("metric")}
    assert steps["task/*"] == "step"
