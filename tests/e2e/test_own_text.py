"""The README's own-text walk-through as a new user follows it: a ~1 MB plain-text
file made from the Python installation, ``data prepare``, ``run`` and ``report`` with
``configs/text.toml`` from the folder that holds the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import ROOT

EXE = Path(sys.executable).with_name("ledgerlm")


def _in(folder: Path, *args: str) -> str:
    proc = subprocess.run(
        [*args], cwd=folder, capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_a_plain_text_file_from_prepare_to_report(tmp_path):
    made = _in(tmp_path, sys.executable, str(ROOT / "examples" / "python_docs_text.py"),
               "python-docs.txt")  # fmt: skip
    assert "python-docs.txt: 1,000,000 characters" in made
    recipe = str(ROOT / "configs" / "text.toml")
    ws = ["-w", "ws"]
    prepared = _in(tmp_path, str(EXE), "data", "prepare", recipe, *ws)
    (version,) = (tmp_path / "ws" / "data").iterdir()
    counts = json.loads((version / "manifest.json").read_text())["counts"]
    assert counts["by_split"]["val"] > 50 and counts["by_split"]["train"] > 3000
    assert f"data version {version.name}" in prepared
    _in(tmp_path, str(EXE), "run", recipe, *ws, "--set", "train.max_steps=20",
        "--set", "eval.every_steps=10")  # fmt: skip
    shown = json.loads(_in(tmp_path, str(EXE), "ledger", "show", "latest", *ws, "--json"))
    assert shown["run"]["data_version"] == version.name  # the prepared version, reused
    assert [e["step"] for e in shown["evaluations"]] == [10, 20]
    assert all(0 < e["metrics"]["bpb"] < 16 for e in shown["evaluations"])
    _in(tmp_path, str(EXE), "report", "latest", *ws, "-o", "report.html")
    html = (tmp_path / "report.html").read_text()
    assert shown["run"]["id"] in html and "bit/byte" in html
