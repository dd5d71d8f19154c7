"""Faults around a run, through the console script: a read-only workspace, a full disk
during a checkpoint, a loss that turns non-finite under either policy. Each gives one
error line naming the path or the step and its cause, no traceback, the run (when
there is one) marked failed, and nothing half-written."""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import TINY, ledgerlm, without_dac_override
from ledgerlm.ledger.store import Ledger

SHORT = ["--set", "train.max_steps=10", "--set", "eval.every_steps=5"]


def _cli() -> str:
    return str(Path(sys.executable).with_name("ledgerlm"))


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _latest(ws: Path) -> tuple[dict, dict]:
    """The newest run of the workspace's ledger and its summary."""
    with Ledger(ws / "ledger.db") as ledger:
        run = ledger.list_runs()[0]
        return run, ledger.run_summary(run["id"])


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A workspace whose data and token versions are built (a 2-step run)."""
    ws = tmp_path_factory.mktemp("prepared") / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=2")
    return ws


def test_a_read_only_workspace_is_one_line_and_nothing_changes(prepared, tmp_path):
    ws = tmp_path / "ro"
    shutil.copytree(prepared, ws)
    before = _tree(ws)
    for p in [ws, *ws.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        cmd = [*without_dac_override(), _cli(), "run", str(TINY), "-w", str(ws), *SHORT]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        line = _one_error_line(proc)
        assert str(ws / "ledger.db") in line and "readonly" in line
        listed = subprocess.run(
            [*without_dac_override(), _cli(), "ledger", "list", "-w", str(ws)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in listed.stderr
    finally:
        for p in [ws, *ws.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert _tree(ws) == before


def _limited(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def test_a_full_disk_during_a_checkpoint_fails_the_run_cleanly(prepared, tmp_path):
    ws = tmp_path / "full"
    shutil.copytree(prepared, ws)
    # A model whose weights file (~2 MB) does not fit under the limit, while the ledger's
    # file and its write-ahead log (a few hundred kB) do.
    wide = ["--set", "model.d_model=128", "--set", "model.n_heads=4"]
    proc = subprocess.run(
        [
            _cli(),
            "run",
            str(TINY),
            "-w",
            str(ws),
            *SHORT,
            *wide,
            "--set",
            "train.checkpoint_every=5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(1_000_000),
    )
    line = _one_error_line(proc)
    assert "checkpoint at step 5 not written (File too large); there is no earlier one" in line
    run, summary = _latest(ws)
    assert run["status"] == "failed"
    assert summary["open_phases"] == 0
    (error,) = [e for e in summary["events"] if e["kind"] == "error"]
    assert "CheckpointWriteError" in error["message"]
    run_dir = ws / "runs" / run["id"]
    assert not (run_dir / "checkpoint").exists()
    assert not list(run_dir.glob(".checkpoint*")), "half a checkpoint was left"
    resumed = ledgerlm("resume", run["id"], "-w", str(ws), check=False)
    assert "--restart" in _one_error_line(resumed)


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_non_finite_loss_is_one_line_under_both_policies(prepared, tmp_path, policy):
    ws = tmp_path / policy
    shutil.copytree(prepared, ws)
    proc = ledgerlm(
        "run",
        str(TINY),
        "-w",
        str(ws),
        "--set",
        "train.lr=1e30",
        "--set",
        f"train.nonfinite={policy}",
        "--set",
        "train.max_steps=150",
        check=False,
    )
    line = _one_error_line(proc)
    assert "non-finite" in line
    run, summary = _latest(ws)
    assert run["status"] == "failed"
    events = [e for e in summary["events"] if e["kind"] == "nonfinite"]
    assert events and json.loads(events[0]["message"])["policy"] == policy
    if policy == "skip":  # the run went on until the skips ran out
        assert len(events) == 100


@pytest.mark.parametrize(
    ("source", "said"),
    [("missing.jsonl", "missing.jsonl"), ("nothing/*.jsonl", "matches no file")],
)
def test_a_missing_input_writes_nothing(tmp_path, source, said):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        TINY.read_text().replace(
            "[data]\n", f'[data]\nsources = ["builtin:stdlib", {{path = "{source}"}}]\n'
        )
    )
    ws = tmp_path / "ws"
    proc = subprocess.run(
        [_cli(), "run", str(recipe), "-w", str(ws)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert said in _one_error_line(proc)
    assert not ws.exists(), sorted(str(p) for p in ws.rglob("*"))
