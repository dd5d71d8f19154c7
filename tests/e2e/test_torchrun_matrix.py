"""More of the recipe under ``torchrun --nproc-per-node 2`` (gloo on CPU), each against
one process with the same global batch (``train.grad_accum=2``): a staged mixture's
tokens per domain, Muon (DDP; refused with FSDP), the MLLOG export's global batch, and
a DoReMi search, which trains in one process and is refused under torchrun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import ledgerlm as package
from ledgerlm.ledger.mixture import plan_event, realised
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.mllog import check_mllog
from ledgerlm.workspace import Workspace, read_json

from .conftest import TINY, ledgerlm
from .ranks import ENV, on_two_ranks, sets, torchrun

TOKEN = ":::MLLOG "
PACKAGE = str(Path(package.__file__).parent)  # in a traceback's frames
# 12 updates: the first half of the budget a code-heavy stage, then all three domains.
MIX = [
    "data.mixture.stages=[{until=0.5,weights={code=0.8,docs=0.2}}]",
    "data.mixture.weights={code=0.2,docs=0.3,math=0.5}",
]
SHORT = ["train.max_steps=12", "eval.every_steps=6"]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun(*args), capture_output=True, text=True, timeout=600, env=ENV)


def _show(ws: Path) -> dict:
    """The latest run's summary, read in process (a CLI call costs seconds)."""
    with Ledger(ws / "ledger.db") as ledger:
        return ledger.run_summary(ledger.resolve_run("latest"))


def _steps(ws: Path, run_id: str) -> list[dict]:
    """Per-update rows without each run's own wall times."""
    with Ledger(ws / "ledger.db") as ledger:
        return [{k: v for k, v in r.items() if k not in ("seconds", "at")}
                for r in ledger.steps(run_id)]  # fmt: skip


def _ranks(summary: dict) -> int:
    event = next(e for e in summary["events"] if e["kind"] == "target_contract")
    return json.loads(event["message"])["ranks"]


def _same_training(two: dict, one: dict, ws: Path) -> None:
    """DDP on two ranks sums the two micro-batches' gradients in the order one process
    accumulates them: the same counts, the same weights bitwise, the same figures."""
    assert (_ranks(two), _ranks(one)) == (2, 1)
    assert two["counters"] == one["counters"]  # global counts, tokens/<domain> among them
    for a, b in zip(two["evaluations"], one["evaluations"], strict=True):
        assert (a["step"], a["tokens"], a["targets"]) == (b["step"], b["tokens"], b["targets"])
        assert a["consumed"] == b["consumed"]  # tokens per domain at each evaluation
        assert a["snapshot"] == b["snapshot"]
        for name, value in b["metrics"].items():
            assert abs(a["metrics"][name] - value) <= 1e-9 * abs(value), name
    rows = [_steps(ws, s["run"]["id"]) for s in (two, one)]
    assert len(rows[0]) == 12 and rows[0] == rows[1]  # tokens, targets, loss, grad norm, lr


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace whose data and token versions exist (``mix plan`` builds them)."""
    root = tmp_path_factory.mktemp("matrix") / "ws"
    ledgerlm("mix", "plan", str(TINY), "-w", str(root), "--json")
    return root


@pytest.fixture(scope="module")
def mixed(ws) -> tuple[dict, dict]:
    """The staged mixture on two DDP ranks, then in one process with grad_accum=2."""
    on_two_ranks("run", str(TINY), "-w", str(ws), *sets(*MIX, *SHORT, "train.parallel=ddp"))
    two = _show(ws)
    ledgerlm("run", str(TINY), "-w", str(ws), *sets(*MIX, *SHORT, "train.grad_accum=2"))
    return two, _show(ws)


@pytest.mark.slow
def test_a_staged_mixture_on_two_ranks_consumes_the_one_process_tokens(ws, mixed):
    two, one = mixed
    _same_training(two, one, ws)
    # The plan's budget is the global one (2 ranks x 16 rows x 64 tokens an update), so
    # the stage ends where the one process's does.
    assert plan_event(two) == plan_event(one)
    assert plan_event(two)["budget_tokens"] == 12 * 2 * 16 * 64
    tokens = {d: two["counters"][f"tokens/{d}"] for d in ("code", "docs", "math")}
    assert sum(tokens.values()) == two["counters"]["tokens"] == 12 * 2 * 16 * 64
    assert all(tokens.values())  # each domain drawn, math only after the stage
    first = two["evaluations"][0]["consumed"]  # the stage: code and docs only
    assert first["math"] < 0.05 * sum(first.values())
    assert realised(two) == realised(one)


def _mllog(ws: Path, run_id: str, out: Path) -> dict:
    ledgerlm("ledger", "export-mllog", run_id, "-o", str(out), "-w", str(ws))
    assert check_mllog(out) == []
    return {
        r["key"]: r
        for r in (json.loads(line[len(TOKEN) :]) for line in out.read_text().splitlines())
    }  # the last record of each key


@pytest.mark.slow
def test_the_mllog_of_two_ranks_reports_the_global_batch(ws, mixed, tmp_path):
    pytest.importorskip("mlperf_logging")
    two, one = mixed
    a = _mllog(ws, two["run"]["id"], tmp_path / "two.txt")
    b = _mllog(ws, one["run"]["id"], tmp_path / "one.txt")
    # 2 ranks x 16 rows x grad_accum 1 == 1 rank x 16 rows x grad_accum 2
    assert a["global_batch_size"]["value"] == b["global_batch_size"]["value"] == 32
    assert two["counters"]["rows"] == 12 * 32  # the rows the ledger counted, per update
    assert a["gradient_accumulation_steps"]["value"] == 1
    assert b["gradient_accumulation_steps"]["value"] == 2
    assert a["eval_accuracy"]["metadata"]["samples_count"] == 12 * 32
    for key in ("samples_count", "epoch_num", "tokens"):
        assert a["eval_accuracy"]["metadata"][key] == b["eval_accuracy"]["metadata"][key], key


MUON = ["train.optimizer=muon", "train.max_steps=12", "eval.every_steps=6"]


@pytest.mark.slow
def test_muon_on_two_ranks_makes_the_one_process_updates(ws):
    # train.parallel = auto: DDP for Muon under torchrun (FSDP is refused, below)
    on_two_ranks("run", str(TINY), "-w", str(ws), *sets(*MUON))
    two = _show(ws)
    state = read_json(ws / "runs" / two["run"]["id"] / "checkpoint" / "state.json")
    assert state["ranks"] == 2 and state.get("format") != "dcp"  # whole replicas, not shards
    assert set(state["optimizer"]) == {"adamw", "muon"}
    ledgerlm("run", str(TINY), "-w", str(ws), *sets(*MUON, "train.grad_accum=2"))
    one = _show(ws)
    assert two["run"]["recipe"]["train"]["optimizer"] == "muon"
    _same_training(two, one, ws)


def test_muon_with_fsdp_is_refused_before_anything_is_written(tmp_path):
    ws = tmp_path / "ws"
    proc = _torchrun("run", str(TINY), "-w", str(ws), *sets(*MUON, "train.parallel=fsdp"))
    assert proc.returncode != 0
    assert (
        "error: train.optimizer = 'muon' orthogonalizes whole matrices, which FSDP shards; "
        "use train.parallel = 'ddp' with muon" in proc.stderr
    )
    assert PACKAGE not in proc.stderr  # one line, no traceback through ledgerlm's code
    assert not ws.exists()  # no ledger, no data version: refused before the data stage


PROXY = ["--proxy", "model.n_layers=1", "--proxy", "train.max_steps=6", "--proxy",
         "eval.every_steps=3"]  # fmt: skip


def test_a_doremi_search_under_torchrun_is_refused(tmp_path):
    """Each rank would run the whole search on the same workspace, racing the other for
    its proxy runs: DoReMi's reweighting is a trainer callback, which runs in one
    process. The search trains nothing and says to run it without torchrun."""
    ws = tmp_path / "ws"
    args = ["mix", "search", str(TINY), "-w", str(ws), "--method", "doremi", *PROXY]
    proc = _torchrun(*args, *sets())
    assert proc.returncode != 0
    assert "error: torchrun started 2 processes, but this command trains in one" in proc.stderr
    assert not (ws / "ledger.db").exists() and not (ws / "data").exists()


def test_a_library_run_without_a_world_refuses_the_torchrun_environment(tmp_path, monkeypatch):
    """``run_recipe`` and ``resume_run`` given no world train in one process: where
    torchrun's environment says there are more, they refuse before touching the
    workspace (rank 0 and its peers would each run the whole run)."""
    from ledgerlm.config import load_recipe
    from ledgerlm.lab.resume import resume_run
    from ledgerlm.lab.run import run_recipe

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="torchrun started 2 processes, but this command"):
        run_recipe(load_recipe(TINY), Workspace(tmp_path / "ws"))
    with pytest.raises(ValueError, match="torchrun started 2 processes, but this command"):
        resume_run(Workspace(tmp_path / "ws"), "latest")
    assert not (tmp_path / "ws").exists()


def test_searches_and_sweeps_refuse_the_torchrun_environment_before_writing(tmp_path, monkeypatch):
    """A mixture search, its verification and a scaling sweep train one proxy run after
    another in one process: under torchrun's environment they refuse before their plan
    or search record is written (a record left behind would be continued later)."""
    from ledgerlm.config import load_recipe
    from ledgerlm.lab.mix_search.doremi import doremi_search
    from ledgerlm.lab.mix_search.regmix import search_mixture
    from ledgerlm.lab.mix_search.verify import verify_mixture
    from ledgerlm.lab.sweep import run_sweep

    monkeypatch.setenv("WORLD_SIZE", "2")
    base, ws = load_recipe(TINY), Workspace(tmp_path / "ws")
    calls = [
        lambda: search_mixture(base, ws, trials=2, proxy=[]),
        lambda: doremi_search(base, ws, proxy=[]),
        lambda: verify_mixture(base, ws, "found"),
        lambda: run_sweep(base, [], ws),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="torchrun started 2 processes, but this command"):
            call()
    assert not (tmp_path / "ws").exists()
