"""What ``ledgerlm tune`` prints: a line per trial and the study's table, readable at 80
columns with no cell cut, every user string shown as written (not read as markup), the
best trial and how to train it; and loading the CLI imports no Optuna."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from ledgerlm.cli import tune_cmd


def _row(number, status, value, **more):
    return {
        "number": number,
        "name": f"tiny-tune-0a1b2c-t{number:02d}",
        "run": f"tiny-tune-0a1b2c-t{number:02d}-20261202-061500-ab12",
        "status": status,
        "value": value,
        "params": {"train.lr": 0.0012345678, "train.optimizer": "[red]adamw"},
        "overrides": ["train.lr=0.0012345678", 'train.optimizer="[red]adamw"'],
        "attempt": 1,
        "device_seconds": 7.5,
        "metric": 5.1234567,
        "time_to_target": value if status == "reached" else None,
        **more,
    }


RECORD = {
    "study": "tiny-tune-0a1b2c",
    "complete": True,
    "seconds": 31.25,
    "device_seconds": 30.0,
    "trials": [
        _row(0, "reached", 6.25),
        _row(1, "not reached", 1e9 + 5.2),
        _row(2, "pruned", None),
        _row(3, "failed", None, attempt=1, error="RuntimeError: boom", retried=True),
        _row(4, "reached", 5.5, attempt=2),
    ],
    "best": {
        "number": 4,
        "run": "tiny-tune-0a1b2c-t04-20261202-061500-ab12",
        "value": 5.5,
        "overrides": ["train.lr=0.0012345678"],
        "status": "reached",
        "metric": 5.12,
    },
}


def test_the_study_table_fits_80_columns_and_shows_strings_as_written(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(tune_cmd, "console", Console(file=out, width=80, color_system=None))
    tune_cmd.print_study(RECORD, Path("configs/tiny.toml"))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    assert text.count('train.optimizer="[red]adamw"') == 5  # as written, in every row
    for status in ("reached", "not reached", "pruned", "failed"):
        assert status in text
    assert "t04 (try 2)" in text
    assert "5 trials in 31.2 s wall, 0.00833 device-hours" in text
    assert "best: t04" in text and "value 5.5" in text
    assert "  ledgerlm run configs/tiny.toml --from-tune tiny-tune-0a1b2c\n" in text


def test_a_trial_line_says_how_it_ended():
    line = tune_cmd.trial_line(RECORD["trials"][3])
    assert line.startswith("tiny-tune-0a1b2c-t03: failed, retried metric 5.123 train.lr=0.001235")
    assert line.endswith("(RuntimeError: boom)")
    assert "to target 6.2 s" in tune_cmd.trial_line(RECORD["trials"][0])


def test_a_best_trial_that_missed_the_target_says_so(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(tune_cmd, "console", Console(file=out, width=80, color_system=None))
    best = {**RECORD["best"], "status": "not reached", "value": 1e9 + 5.12}
    tune_cmd.print_study({**RECORD, "best": best}, Path("r.toml"))
    assert "target not reached, final metric 5.12" in " ".join(out.getvalue().split())


def test_loading_the_cli_imports_no_optuna():
    code = "import sys, ledgerlm.cli.main; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_hint_to_train_the_best_trial_repeats_the_studys_overrides(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(tune_cmd, "console", Console(file=out, width=200, color_system=None))
    tune_cmd.print_study(RECORD, Path("configs/tiny.toml"), ["train.max_steps=40", "name='a b'"])
    hint = "ledgerlm run configs/tiny.toml --set train.max_steps=40 --set 'name='\"'\"'a b'\"'\"''"
    assert f"  {hint} --from-tune tiny-tune-0a1b2c\n" in out.getvalue()
