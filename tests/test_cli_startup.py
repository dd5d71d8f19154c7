"""The command line starts fast: no heavy library is imported until a command needs it,
so `--help`, `--version` and the commands that only read the ledger answer at once
(how long they take is measured by bench/cli_startup.py, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_runner import ledgerlm

HEAVY = ("torch", "pyarrow", "numpy", "scipy", "lightgbm", "tokenizers", "pandas")


def test_loading_the_cli_imports_no_heavy_library():
    code = (
        f"import sys, ledgerlm.cli.main; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported at start-up: {out.stdout.strip()}"


def test_version():
    from ledgerlm import __version__

    assert ledgerlm("--version").stdout.strip() == f"ledgerlm {__version__}"


def test_an_unknown_recipe_key_suggests_the_close_one(tmp_path):
    proc = ledgerlm("config", "show", str(Path(__file__).parents[1] / "configs" / "tiny.toml"),
                    "--set", "train.lrr=0.1", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "unknown key 'train.lrr'; did you mean lr?" in proc.stderr
