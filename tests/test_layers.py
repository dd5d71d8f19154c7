"""The layer contract `make lint` enforces (import-linter, configured in pyproject.toml)
holds for the package, and fails for a copy of it with one import that runs upward or
makes a cycle."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT.exists(), reason="lint-imports not installed (pip install -e '.[dev]')"
)


def _lint(src: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}  # the copy shadows the installed package
    return subprocess.run(
        [str(LINT), "--no-logo", "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "ledgerlm", src / "ledgerlm")
    return src


def test_the_package_keeps_its_layers(tmp_path):
    out = _lint(_copy(tmp_path), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # a component reaching up into the lab
        ("train/loss.py", "import ledgerlm.lab.run", "Layers"),
        # the old loop: the ledger rendering with the scaling fit
        ("ledger/store.py", "import ledgerlm.scaling.fit", "Layers"),
        # tokens and model are independent siblings
        ("tokens/packing.py", "import ledgerlm.model.attention", "Layers"),
        # two modules of one package importing each other
        ("ledger/target.py", "import ledgerlm.ledger.store", "No import cycles"),
    ],
)
def test_an_upward_or_cyclic_import_breaks_the_contract(tmp_path, module, line, broken):
    src = _copy(tmp_path)
    path = src / "ledgerlm" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    out = _lint(src, tmp_path)
    assert out.returncode != 0
    assert broken in out.stdout and "BROKEN" in out.stdout, out.stdout
