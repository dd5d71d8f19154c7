"""A run's sinks are sent the settings in effect: what ``Recipe.unused_settings`` names
(the built-in corpus's caps when no source is builtin, target_loss beside target_bpb)
never reaches MLflow, neither while the run trains nor when the ledger is exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import TINY
from ledgerlm.config import Recipe, load_recipe
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.lab.sinks import open_sinks, replay_to_sinks
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.sinks import flat_params
from ledgerlm.workspace import Workspace

pytest.importorskip("mlflow", reason="pip install 'ledgerlm[mlflow]'")


def _recipe(uri: str) -> Recipe:
    """configs/tiny.toml on a JSONL source of one's own, its target in bits per byte."""
    sets = ['data.sources=["corpus.jsonl"]', "eval.target_bpb=2.2", 'log.sinks=["mlflow"]']
    return load_recipe(TINY, [*sets, f"log.mlflow_uri={json.dumps(uri)}"])


def _in_effect(recipe: Recipe) -> set[str]:
    unused = recipe.unused_settings()
    assert {"data.builtin", "eval.target_loss"} <= set(unused)
    return {
        key
        for key in flat_params(recipe.to_dict())
        if not any(key == u or key.startswith(f"{u}.") for u in unused)
    }


def _params(uri: str) -> dict[str, str]:
    """The params of the one MLflow run at ``uri``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("ledgerlm").experiment_id])
    return run.data.params


def _ledger_run(tmp_path: Path, recipe: Recipe) -> tuple[Ledger, str]:
    ledger = Ledger(tmp_path / "ledger.db")
    run_id = ledger.create_run(
        recipe.name, recipe.to_dict(), target_metric="bpb", target_value=2.2, eval_every=20
    )
    return ledger, run_id


def test_a_live_mlflow_copy_gets_only_the_settings_in_effect(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    recipe = _recipe(uri)
    ledger, run_id = _ledger_run(tmp_path, recipe)
    recorder = LedgerRecorder(ledger, run_id, flush_every=20)
    open_sinks(recorder, recipe, tmp_path / "run")
    ledger.finish_run(run_id, "not reached")
    recorder.close()
    ledger.close()

    params = _params(uri)
    assert set(params) == _in_effect(recipe)
    assert not [key for key in params if key.startswith("data.builtin.")]
    assert "eval.target_loss" not in params and params["eval.target_bpb"] == "2.2"
    assert params["data.sources"] == '["corpus.jsonl"]'


def test_an_export_to_mlflow_gets_only_the_settings_in_effect(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "exported").as_uri()
    recipe = _recipe((tmp_path / "unused").as_uri())
    ledger, run_id = _ledger_run(tmp_path, recipe)
    ledger.finish_run(run_id, "not reached")
    replay_to_sinks(ledger, Workspace(tmp_path), run_id, "mlflow", uri)
    ledger.close()

    params = _params(uri)
    assert set(params) == _in_effect(recipe)
    assert not [key for key in params if key.startswith("data.builtin.")]
