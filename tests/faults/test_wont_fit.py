"""Recipes that cannot fit in memory, through the console script: refused in one line with
the estimate and the limit, before the data stages or the model, instead of a
``DefaultCPUAllocator: can't allocate memory`` traceback half a minute later."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

from cli_runner import TINY
from ledgerlm.config import load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.ledger.store import Ledger
from ledgerlm.tokens.shards import build_tokens
from ledgerlm.workspace import Workspace

GIB = 2**30


def _run(ws: Path, *overrides: str, limit: int | None = None) -> tuple[str, float]:
    """``ledgerlm run tiny.toml`` with ``overrides`` (under an address-space limit of
    ``limit`` bytes): its one error line and how long it took."""

    def pre() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))

    sets = [arg for o in overrides for arg in ("--set", o)]
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ledgerlm")), "run", str(TINY), "-w", str(ws), *sets],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=pre,
    )
    seconds = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: train: the recipe needs about")
    return lines[0], seconds


def test_a_hundred_thousand_rows_are_refused_before_any_work(tmp_path):
    ws = tmp_path / "ws"
    line, seconds = _run(ws, "train.micro_batch_rows=100000")
    assert "activations" in line and "for 100,000 rows x 64 tokens" in line
    assert "of RAM available; lower train.micro_batch_rows to" in line
    assert not ws.exists()  # no ledger, no run, no data stage
    assert seconds < 60, seconds  # interpreter and imports, on a loaded machine


def test_a_model_too_wide_for_the_address_space_limit_is_refused(tmp_path):
    """``ulimit -v`` makes the allocator fail where RAM would not: the limit is read."""
    ws = tmp_path / "ws"
    line, _ = _run(ws, "model.d_model=4096", limit=6 * GIB)
    assert "(parameters 1.5, gradients 1.5, optimizer 3.0," in line
    assert "left under the address-space limit (ulimit -v)" in line
    assert "use a smaller model (model.d_model, model.n_layers)" in line
    assert not ws.exists()


def test_a_reused_tokenizer_is_checked_once_its_version_is_known(tmp_path):
    """Only the token version tells a reused tokenizer's vocabulary: the run exists by
    then, so it is marked failed with the line as its error, and no model was built."""
    ws = tmp_path / "ws"
    recipe = load_recipe(TINY)
    tokens = build_tokens(
        prepare_data(recipe.data_stage(), Workspace(ws)), recipe.tokenizer, Workspace(ws)
    )
    line, _ = _run(ws, f"tokenizer.reuse={tokens.version}", "train.micro_batch_rows=100000")
    assert "for 100,000 rows x 64 tokens" in line
    with Ledger(ws / "ledger.db") as ledger:
        (run,) = ledger.list_runs()
        summary = ledger.run_summary(run["id"])
    assert run["status"] == "failed"
    (error,) = [e for e in summary["events"] if e["kind"] == "error"]
    assert error["message"].startswith("WontFitError: train: the recipe needs about")
    assert not any(p["kind"] == "train" for p in summary["phases"])
    assert not (ws / "runs" / run["id"] / "checkpoint").exists()
