"""`ledgerlm lessons [NAME]... [--json]`: a thin command over ``ledgerlm.lessons``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli_runner import ledgerlm

NAMES = ["dedup-target", "mixture-gradient", "learning-rate", "confirm-target"]


def _cli(*args: str) -> SimpleNamespace:
    """The app in this process (torch is imported once for the whole module)."""
    from ledgerlm.cli.main import app

    result = CliRunner().invoke(app, ["lessons", *args], env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return SimpleNamespace(code=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def test_lessons_prints_every_lesson_with_its_verdict():
    out = _cli()
    assert out.code == 0, out.stdout + out.stderr
    for name in NAMES:
        assert f"PASS {name}: " in out.stdout
    assert "ok   uniform mean over the raw records: 0.6667 (expected 2/3)" in out.stdout
    assert "D (prep 300 s, 2000 x 0.9 s): confirmed at step 1500 after 1710 s" in out.stdout
    assert "4 of 4 lessons passed" in out.stdout
    assert "FAIL" not in out.stdout


def test_lessons_json_is_machine_readable():
    out = _cli("--json")
    assert out.code == 0
    data = json.loads(out.stdout)
    assert data["passed"] is True and data["seconds"] < 10
    assert [lesson["name"] for lesson in data["lessons"]] == NAMES
    confirm = data["lessons"][-1]
    assert confirm["values"]["D"]["seconds"] == pytest.approx(1710)
    assert {"what", "got", "expected", "passed"} <= set(confirm["checks"][0])


def test_one_named_lesson():
    out = _cli("learning-rate", "--json")
    assert [lesson["name"] for lesson in json.loads(out.stdout)["lessons"]] == ["learning-rate"]


def test_a_failing_lesson_exits_1_and_says_which_check(monkeypatch):
    import ledgerlm.ledger.target as target

    real = target.time_to_target
    monkeypatch.setattr(
        target,
        "time_to_target",
        lambda phases, evaluations, *a, **k: real(
            [p for p in phases if p["kind"] != "prep"], evaluations, *a, **k
        ),
    )  # preparation left off the bill
    out = _cli("confirm-target")
    assert out.code == 1
    assert "FAIL confirm-target" in out.stdout
    assert "FAIL D (prep 300 s, 2000 x 0.9 s): confirmed at step 1500 after 1410 s" in out.stdout
    assert "0 of 1 lessons passed" in out.stdout
    data = json.loads(_cli("confirm-target", "--json").stdout)
    assert data["passed"] is False and data["lessons"][0]["passed"] is False


@pytest.mark.parametrize("name", ["nope", "[red]bad[/red]"])
def test_an_unknown_name_is_one_line_naming_the_lessons(name):
    out = _cli("learning-rate", name)
    assert out.code == 2
    assert out.stderr == (
        f"error: unknown lesson {name!r} (lessons: dedup-target, mixture-gradient, "
        "learning-rate, confirm-target)\n"
    )
    assert out.stdout == ""


def test_help_explains_each_lesson_in_one_line_without_importing_torch():
    proc = ledgerlm("lessons", "--help")
    lines = proc.stdout.splitlines()
    for name in NAMES:
        (line,) = [x for x in lines if x.strip().startswith(f"{name}: ")]
        assert len(line.strip()) > len(name) + 10
    code = "import sys, ledgerlm.cli.lessons_cmd; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_console_script_runs_a_lesson():
    # confirm-target needs neither numpy nor torch: the installed entry point, end to end
    proc = ledgerlm("lessons", "confirm-target", "--json")
    assert json.loads(proc.stdout)["lessons"][0]["passed"] is True


@pytest.mark.slow
def test_the_console_script_runs_all_lessons_in_under_10_seconds():
    # torch's import alone is 1-3 s of it, so this runs with the slow tests
    start = time.perf_counter()
    proc = ledgerlm("lessons", "--json")
    elapsed = time.perf_counter() - start
    assert json.loads(proc.stdout)["passed"] is True
    assert elapsed < 10, f"{elapsed:.1f} s"
