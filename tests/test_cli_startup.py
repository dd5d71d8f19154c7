"""The command line starts fast: no heavy library is imported until a command needs it,
so `--help`, `--version` and the commands that only read the ledger answer at once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_runner import ledgerlm

HEAVY = ("torch", "pyarrow", "numpy", "scipy", "lightgbm", "tokenizers", "pandas")
HELP_SECONDS = 0.5  # the goal for any --help, over a bare interpreter's start


def test_loading_the_cli_imports_no_heavy_library():
    code = (
        f"import sys, ledgerlm.cli.main; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"imported at start-up: {out.stdout.strip()}"


def _best(cmd: list[str], n: int = 3) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, timeout=60)
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.parametrize(
    "args", [["--help"], ["mix", "search", "--help"], ["ledger", "show", "--help"]]
)
def test_help_answers_within_half_a_second_of_a_bare_interpreter(args):
    exe = str(Path(sys.executable).with_name("ledgerlm"))
    bare = _best([sys.executable, "-c", "pass"])
    helped = _best([exe, *args])
    ratio = helped / bare
    assert helped - bare < HELP_SECONDS, f"{helped:.2f} s vs {bare:.3f} s bare ({ratio:.0f}x)"


def test_version():
    from ledgerlm import __version__

    assert ledgerlm("--version").stdout.strip() == f"ledgerlm {__version__}"


def test_an_unknown_recipe_key_suggests_the_close_one(tmp_path):
    proc = ledgerlm("config", "show", str(Path(__file__).parents[1] / "configs" / "tiny.toml"),
                    "--set", "train.lrr=0.1", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "unknown key 'train.lrr'; did you mean lr?" in proc.stderr
