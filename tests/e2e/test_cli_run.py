"""End to end through the console script on the tiny recipe."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerlm.ledger.store import Ledger

from .conftest import ROOT, TINY, ledgerlm


def _show(ws, run):
    return json.loads(ledgerlm("ledger", "show", run, "--json", "-w", str(ws)).stdout)


def test_run_prints_the_summary_and_reaches_the_target(tiny_workspace):
    out = (tiny_workspace / "run.stdout").read_text()
    for heading in ("data funnel", "time per phase", "evaluations", "counters"):
        assert heading in out
    assert "target reached at step" in out
    assert "unigram entropy" in out


def test_phases_cover_the_wall_time_of_the_run(tiny_workspace, tiny_run_id):
    """From the command's start to the end of its last phase, every second is in a phase:
    the start-up before the run existed (interpreter, imports) is a ``startup`` phase,
    then from the run's creation on ``setup`` and the rest; time-to-target is the wall
    time until the confirmation, start-up included."""
    s = _show(tiny_workspace, tiny_run_id)
    c = s["coverage"]
    assert c["wall_seconds"] > 1.0
    assert c["uncovered_seconds"] < min(0.2, 0.01 * c["wall_seconds"])
    assert c["interrupted_seconds"] == 0
    (startup,) = [p for p in s["phases"] if p["kind"] == "startup"]
    assert startup["seconds"] > 0.2  # at least importing torch
    assert startup["ended_at"] == pytest.approx(s["run"]["created_at"], abs=0.1)
    assert s["total_seconds"] == pytest.approx(c["wall_seconds"] + startup["seconds"], abs=0.2)
    setup = [p for p in s["phases"] if p["kind"] == "setup"]
    assert setup and setup[0]["started_at"] - s["run"]["created_at"] < 0.05
    assert s["time_to_target"]["by_phase"]["startup"] == pytest.approx(startup["seconds"])
    assert s["time_to_target"]["seconds"] >= sum(p["seconds"] for p in [startup, *setup])


def test_ledger_show_names_time_between_phases(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        run = ledger.create_run("gap", {}, target_metric="loss", target_value=1.0, eval_every=1)
        with ledger.phase(run, "prep"):
            pass
        ledger._conn.execute("UPDATE runs SET created_at = created_at - 0.5 WHERE id = ?", (run,))
    out = ledgerlm("ledger", "show", run, "-w", str(tmp_path)).stdout
    assert "uncovered: 0.50 s" in out
    shown = ledgerlm("ledger", "show", run, "-w", str(tmp_path), "--json").stdout
    assert json.loads(shown)["coverage"]["uncovered_seconds"] == pytest.approx(0.5, abs=0.01)


def test_ledger_show_json_reports_everything_from_the_database(tiny_workspace, tiny_run_id):
    s = _show(tiny_workspace, tiny_run_id)
    assert s["run"]["status"] == "reached"
    kinds = {p["kind"] for p in s["phases"]}
    assert kinds == {"startup", "setup", "prep", "tokenize", "train", "eval", "checkpoint"}
    assert all(p["seconds"] is not None and p["seconds"] >= 0 for p in s["phases"])
    c = s["counters"]
    assert c["optimizer_updates"] >= 1
    assert c["supervised_targets"] <= c["tokens"]
    evals = s["evaluations"]
    assert evals and all(len(e["snapshot"]) == 16 and "loss" in e["metrics"] for e in evals)
    assert [e["step"] for e in evals] == sorted(e["step"] for e in evals)

    ttt = s["time_to_target"]
    assert ttt["reached"] and ttt["step"] == evals[-1]["step"]  # stop_at_target
    confirming = ttt["evaluation"]
    assert confirming["metrics"]["loss"] <= s["run"]["target_value"]
    assert all(e["metrics"]["loss"] > s["run"]["target_value"] for e in evals[:-1])
    expected = sum(p["seconds"] for p in s["phases"] if p["id"] <= confirming["phase_id"])
    assert ttt["seconds"] == pytest.approx(expected)
    assert ttt["seconds"] < s["total_seconds"]  # the checkpoint came after the target

    contract = next(json.loads(e["message"]) for e in s["events"] if e["kind"] == "target_contract")
    assert s["run"]["target_value"] < contract["val_unigram_entropy"]


def test_rerun_reuses_data_and_token_versions(tiny_workspace_copy, tiny_run_id):
    ws = tiny_workspace_copy
    first = _show(ws, tiny_run_id)
    ledgerlm("run", str(TINY), "-w", str(ws))
    listed = json.loads(ledgerlm("ledger", "list", "-w", str(ws), "--json").stdout)
    (again,) = {r["id"] for r in listed} - {tiny_run_id}
    second = _show(ws, again)
    assert second["run"]["data_version"] == first["run"]["data_version"]
    assert second["run"]["tokens_version"] == first["run"]["tokens_version"]
    reused = {
        p["kind"]: p["detail"]["reused"]
        for p in second["phases"]
        if p["kind"] in ("prep", "tokenize")
    }
    assert reused == {"prep": True, "tokenize": True}
    assert len(list((ws / "data").iterdir())) == 1
    assert len(list((ws / "tokens").iterdir())) == 1
    # same data, same seed: the same evaluations
    assert [e["metrics"] for e in second["evaluations"]] == [
        e["metrics"] for e in first["evaluations"]
    ]


def test_a_target_that_is_never_met_is_not_reached(tmp_path):
    proc = ledgerlm(
        "run",
        str(TINY),
        "-w",
        str(tmp_path),
        "--set",
        "eval.target_loss=0.5",
        "--set",
        "train.max_steps=20",
    )
    assert "target NOT reached" in proc.stdout
    s = _show(tmp_path, "latest")  # the one run in its own workspace
    assert s["run"]["status"] == "not reached"
    assert s["time_to_target"] == {**s["time_to_target"], "reached": False, "seconds": None}


@pytest.mark.parametrize(
    ("recipe_text", "override", "message"),
    [
        ("[train]\nlearning_rate = 0.1\n", None, "unknown key 'train.learning_rate'"),
        ('[model]\nd_model = "wide"\n', None, "model.d_model"),
        ("", "pack.seq_len=two", "pack.seq_len"),
    ],
)
def test_bad_recipe_is_one_clear_line_and_writes_nothing(tmp_path, recipe_text, override, message):
    recipe = tmp_path / "bad.toml"
    recipe.write_text(recipe_text)
    ws = tmp_path / "ws"
    args = ["run", str(recipe), "-w", str(ws)] + (["--set", override] if override else [])
    proc = ledgerlm(*args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(recipe) in lines[0]
    assert "Traceback" not in proc.stderr
    assert not ws.exists()


def test_missing_recipe_file(tmp_path):
    proc = ledgerlm("run", str(tmp_path / "nope.toml"), "-w", str(tmp_path / "ws"), check=False)
    assert proc.returncode == 2
    assert "nope.toml: recipe file not found" in proc.stderr
    assert not (tmp_path / "ws").exists()


def test_config_show_prints_the_resolved_recipe():
    out = ledgerlm("config", "show", str(TINY), "--set", "train.lr=0.01", "--json").stdout
    resolved = json.loads(out)
    assert resolved["train"]["lr"] == 0.01
    assert resolved["model"]["rope_theta"] == 10000.0  # defaults are filled in


def test_data_prepare_and_inspect(tmp_path):
    out = ledgerlm("data", "prepare", str(TINY), "-w", str(tmp_path)).stdout
    assert "data version" in out
    version = out.split("data version ")[1].split()[0]
    manifest = json.loads(
        ledgerlm("data", "inspect", version[:6], "-w", str(tmp_path), "--json").stdout
    )
    c = manifest["counts"]
    dropped = sum(d["documents"] for d in c["dropped"])
    assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
    text = ledgerlm("data", "inspect", version, "-w", str(tmp_path)).stdout
    assert c["conservation"] in text and "funnel" in text


def test_every_command_has_help():
    """The installed console script answers --help; every command does, in process."""
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app

    assert "Usage" in ledgerlm("--help").stdout
    runner = CliRunner()
    for args in (
        [],
        ["run"],
        ["demo"],
        ["config"],
        ["config", "show"],
        ["data"],
        ["data", "prepare"],
        ["data", "inspect"],
        ["ledger"],
        ["ledger", "list"],
        ["ledger", "show"],
        ["resume"],
        ["train"],
        ["export", "hf"],
        ["report"],
        ["scale", "plan"],
    ):
        result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "Usage" in result.output, args


def test_run_stores_the_resolved_recipe(tiny_workspace, tiny_run_id):
    s = _show(tiny_workspace, tiny_run_id)
    stored = (tiny_workspace / "runs" / s["run"]["id"] / "recipe.toml").read_text()
    assert 'name = "tiny"' in stored and "rope_theta" in stored
    assert s["run"]["recipe"]["model"]["d_model"] == 64
    assert (ROOT / "configs" / "demo.toml").is_file()


def test_data_prepare_on_jsonl_shows_funnel_groups_clusters_and_drops(tmp_path):
    rows = [
        {"id": f"d{i}", "text": f"unique body {i} " + " ".join(f"w{i}x{j}" for j in range(40))}
        for i in range(20)
    ]
    rows += [{"id": "dup", "text": rows[0]["text"].upper()}, {"id": "tiny", "text": "hi"}]
    lines = [json.dumps(r) for r in rows] + ["{broken"]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        f'[data]\nsources = [{{path = "{tmp_path / "c.jsonl"}", domain = "web"}}]\n'
        "val_fraction = 0.2\n"
    )
    out = ledgerlm(
        "data",
        "prepare",
        str(recipe),
        "-w",
        str(tmp_path / "ws"),
        "--executor",
        "local",
        "--workers",
        "1",
    ).stdout
    version = out.split("data version ")[1].split()[0]
    m = json.loads(
        ledgerlm("data", "inspect", version, "-w", str(tmp_path / "ws"), "--json").stdout
    )
    c = m["counts"]
    assert c["conservation"] == "23 = 20 kept + 2 dropped + 1 quarantined"
    assert c["quarantined_by_reason"] == {"bad_json": 1}
    assert m["clusters"]["top"] == [{"cluster_id": "d0", "size": 2, "members": ["d0", "dup"]}]
    assert {(d["step"], d["reason"], d["id"]) for d in m["sample_drops"]} == {
        ("exact_dedup", "duplicate", "dup"),
        ("length", "too_short", "tiny"),
    }
    filters = next(s for s in m["steps"] if s["name"] == "filters")
    assert any(g["docs_dropped"] == 1 and g["step"] == "length" for g in filters["groups"])
    text = ledgerlm("data", "inspect", version, "-w", str(tmp_path / "ws")).stdout
    assert "largest duplicate clusters" in text and "filters by group" in text


def test_export_hf_loads_in_transformers_and_refuses_to_overwrite(
    tiny_workspace, tiny_run_id, tmp_path, monkeypatch
):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "Usage" in ledgerlm("export", "hf", "--help").stdout
    out = tmp_path / "hf"
    ledgerlm("export", "hf", tiny_run_id, str(out), "-w", str(tiny_workspace))
    model = transformers.LlamaForCausalLM.from_pretrained(out, local_files_only=True)
    assert model.config.vocab_size == 512 and model.config.hidden_size == 64
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(out, local_files_only=True)
    version = _show(tiny_workspace, tiny_run_id)["run"]["tokens_version"]
    ours = Tokenizer.from_file(str(tiny_workspace / "tokens" / version / "tokenizer.json"))
    text = "def add(a, b):\n    return a + b  # ünïcode"
    # BOS first, as every document was packed in training; then the training encoding
    assert tok(text)["input_ids"] == [model.config.bos_token_id, *ours.encode(text).ids]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        model.config.bos_token_id,
        model.config.eos_token_id,
        model.config.pad_token_id,
    )

    again = ledgerlm("export", "hf", tiny_run_id, str(out), "-w", str(tiny_workspace), check=False)
    assert again.returncode == 2
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and "not empty" in lines[0] and "--force" in lines[0]
    assert "Traceback" not in again.stderr


def test_output_sent_to_a_file_shows_progress_as_it_happens(tmp_path, monkeypatch):
    """stdout is a pipe here: plain periodic lines with the step, loss, lr, tokens/s and
    ETA; a --json command keeps its stdout JSON."""
    monkeypatch.setenv("LEDGERLM_PROGRESS_SECONDS", "0.001")
    ws = str(tmp_path / "ws")
    out = ledgerlm("run", str(TINY), "-w", ws, "--set", "train.max_steps=30").stdout
    lines = [line for line in out.splitlines() if "] train " in line]
    assert len(lines) >= 2 and lines[-1].split("] ")[1].startswith("train 30/30 done")
    assert re.search(r"train \d+/30 \(\d+%\) ETA [\d,]+ s loss [\d.]+ lr \S+ tok/s [\d,]+", out)
    planned = ledgerlm("mix", "plan", str(TINY), "-w", ws, "--json").stdout
    assert json.loads(planned)["budget_tokens"] > 0


def test_ledger_list_never_cuts_a_run_id_in_a_narrow_terminal(tiny_workspace):
    exe = Path(sys.executable).with_name("ledgerlm")
    shown = subprocess.run(
        [str(exe), "ledger", "list", "-w", str(tiny_workspace)],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, check=True,
    ).stdout  # fmt: skip
    runs = json.loads(ledgerlm("ledger", "list", "-w", str(tiny_workspace), "--json").stdout)
    assert runs and all(r["id"] in shown for r in runs)
    assert all(r["data_version"][:12] in shown for r in runs)
