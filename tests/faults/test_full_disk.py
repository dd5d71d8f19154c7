"""A disk that fills up names where: `data prepare` on a full file system or past a file
size limit says which folder it was writing, and a checkpoint that cannot be written
says whether an earlier one is kept.

A full disk is a 64 kB tmpfs where this process may mount one (root); everywhere, a file
size limit (``RLIMIT_FSIZE``, with SIGXFSZ ignored so the write fails with EFBIG
instead of killing the process) makes the same write fail the same way."""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from cli_runner import TINY
from ledgerlm.config import ModelConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.train.checkpoint import CheckpointWriteError, save_checkpoint

VERSION_DIR = "data/.building-"  # the data version's build folder


def _cli() -> str:
    return str(Path(sys.executable).with_name("ledgerlm"))


def _limited(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_a_file_size_limit_during_data_prepare_names_the_folder(tmp_path):
    ws = tmp_path / "ws"
    proc = subprocess.run(
        [_cli(), "data", "prepare", str(TINY), "-w", str(ws)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(30_000),  # the first pass's shard (~60 kB) does not fit
    )
    line = _one_error_line(proc)
    assert line.startswith(f"error: {ws / VERSION_DIR}") and line.endswith(": File too large")


@pytest.fixture
def tiny_disk(tmp_path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root): the file size limit stands in")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_during_data_prepare_names_the_folder(tiny_disk):
    ws = tiny_disk / "ws"
    proc = subprocess.run(
        [_cli(), "data", "prepare", str(TINY), "-w", str(ws)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = _one_error_line(proc)
    assert line.startswith(f"error: {ws / VERSION_DIR}"), line
    assert line.endswith(": No space left on device"), line


@contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """This process cannot write a file past ``limit`` bytes for the block."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


def test_a_failed_checkpoint_says_whether_an_earlier_one_is_kept(tmp_path):
    model = GPT(ModelConfig(d_model=32, n_layers=1, n_heads=2), 64)  # ~10 kB of weights
    folder = tmp_path / "run" / "checkpoint"
    with pytest.raises(CheckpointWriteError) as first, _file_size_limit(4096):
        save_checkpoint(folder, model, {"step": 2})
    assert str(first.value) == (
        f"{folder}: checkpoint at step 2 not written (File too large); there is no earlier one"
    )
    save_checkpoint(folder, model, {"step": 4})
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    with pytest.raises(CheckpointWriteError) as later, _file_size_limit(4096):
        save_checkpoint(folder, model, {"step": 6})
    assert str(later.value).endswith("not written (File too large); the previous one is intact")
    assert sorted(p.name for p in folder.parent.iterdir()) == ["checkpoint"]  # nothing else
    shutil.rmtree(folder)
