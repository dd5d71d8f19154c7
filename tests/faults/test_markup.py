"""Text a user controls (a source, a domain, a document id, a run's name, a metric) that
looks like rich markup prints as itself: `[/bold]` is a closing tag that matches nothing,
and used to crash every command that printed it (rich.errors.MarkupError)."""

from __future__ import annotations

import json
import random
import re

import pytest

from cli_runner import ledgerlm
from ledgerlm.ledger.store import Ledger

CLOSE = "[/bold]"  # an unmatched closing tag: a MarkupError when parsed as markup
COLOR = "[red]x"  # an opening tag: silently eaten (and the text coloured) when parsed
WORDS = [f"w{i}{c}" for i in range(300) for c in "xyz"]


def _no_crash(proc) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MarkupError" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def data_version(tmp_path_factory) -> tuple:
    """A data version whose source, domains and document ids are markup-like."""
    tmp = tmp_path_factory.mktemp("markup")
    rng = random.Random(0)
    records = []
    for i in range(40):
        text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(6))
        record = {"id": f"{CLOSE}{i}", "text": text}
        if i % 2:
            record["domain"] = CLOSE  # the record's own domain; the others get the input's
        records.append(record)
    records.append({"id": f"{CLOSE}dup", "text": records[0]["text"]})  # a duplicate cluster
    records.append({"id": f"{COLOR}short", "text": "too short"})  # dropped by a filter
    (tmp / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    q = json.dumps  # a TOML basic string
    source = f"{{path = {q(str(tmp / 'docs.jsonl'))}, source = {q(CLOSE)}, domain = {q(COLOR)}}}"
    recipe = tmp / "markup.toml"
    recipe.write_text(
        f'name = "markup"\n[data]\nsources = [{source}]\nval_fraction = 0.2\nworkers = 1\n'
    )
    ws = tmp / "ws"
    proc = ledgerlm("data", "prepare", str(recipe), "-w", str(ws), check=False)
    _no_crash(proc)
    version = re.search(r"data version (\w+)", proc.stdout).group(1)
    return ws, version, proc


def test_data_prepare_and_inspect_print_markup_as_text(data_version):
    ws, version, _ = data_version
    proc = ledgerlm("data", "inspect", version, "-w", str(ws), check=False)
    _no_crash(proc)
    out = proc.stdout
    assert f"{CLOSE}  " in out or f" {CLOSE}" in out  # the domain, in the split/domain lines
    assert COLOR in out  # the input's domain
    assert "filters by group" in out and "largest duplicate clusters" in out
    assert f"{CLOSE}0" in out and f"{CLOSE}dup" in out  # the cluster's document ids
    assert "\\[" not in out  # escaped for rich, printed without the escape


def test_ledger_commands_print_markup_as_text(tmp_path):
    """An old ledger may hold a run whose name is markup (names are checked only since),
    and metrics are named after domains."""
    with Ledger(tmp_path / "ledger.db") as ledger:
        runs = []
        for seed in (0, 1):
            run = ledger.create_run(
                CLOSE,
                {"name": CLOSE, "train": {"seed": seed}, "data": {"domain": COLOR}},
                target_metric=f"loss/{COLOR}",
                target_value=3.0,
                eval_every=1,
            )
            phase = ledger.record_phase(run, "eval", 1.0, step_start=1, step_end=1)
            ledger.add_evaluation(
                run,
                step=1,
                tokens=10,
                targets=10,
                updates=1,
                metrics={"loss": 3.5, f"loss/{COLOR}": 2.5, f"loss/{CLOSE}": 4.0},
                snapshot=CLOSE,
                phase_id=phase,
            )
            ledger.set_counters(run, {"tokens": 10, f"docs/{CLOSE}": 3})
            ledger.finish_run(run, "reached")
            runs.append(run)
    ws = str(tmp_path)
    listed = ledgerlm("ledger", "list", "-w", ws, check=False)
    _no_crash(listed)
    assert all(run in listed.stdout for run in runs)
    shown = ledgerlm("ledger", "show", runs[0], "-w", ws, check=False)
    _no_crash(shown)
    for text in (runs[0], f"loss/{COLOR}", f"loss/{CLOSE}", f"docs/{CLOSE}"):
        assert text in shown.stdout
    compared = ledgerlm("ledger", "compare", *runs, "-w", ws, check=False)
    _no_crash(compared)
    assert runs[0] in compared.stdout and runs[1] in compared.stdout


def test_an_error_message_with_markup_is_one_plain_line(tmp_path):
    recipe = tmp_path / f"{CLOSE[1:-1].replace('/', '')}.toml"
    recipe.write_text(f"name = {json.dumps(CLOSE)}\n")
    proc = ledgerlm("config", "show", str(recipe), check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert f"name: '{CLOSE}'" in proc.stderr
