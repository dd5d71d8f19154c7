"""Requirement T6 through the CLI: ``ledgerlm train RECIPE --init-from RUN`` starts from the
run's weights and tokenizer and reports every domain before and after."""

import json

import pytest

from .conftest import TINY, ledgerlm

MATH_ONLY = (
    TINY.read_text()
    .replace("code_docs = 40", "code_docs = 0")
    .replace("docs_docs = 20", "docs_docs = 0")
)


def _show(ws, run="latest"):
    return json.loads(ledgerlm("ledger", "show", run, "--json", "-w", str(ws)).stdout)


@pytest.mark.slow
def test_continued_pretraining_reports_gain_and_forgetting(tmp_path):
    ws = str(tmp_path / "ws")
    short = ["--set", "train.max_steps=20", "--set", "eval.stop_at_target=false"]
    ledgerlm("run", str(TINY), "-w", ws, *short)
    first = _show(ws)
    recipe = tmp_path / "math.toml"
    recipe.write_text(MATH_ONLY.replace('name = "tiny"', 'name = "math"'))

    proc = ledgerlm("train", str(recipe), "--init-from", first["run"]["id"], "-w", ws, *short)
    assert "continued pretraining from " + first["run"]["id"] in proc.stdout
    second = _show(ws)
    stored = second["run"]["recipe"]
    assert stored["train"]["init_from"] == first["run"]["id"]
    assert stored["tokenizer"]["reuse"] == first["run"]["tokens_version"]
    assert second["run"]["tokens_version"] != first["run"]["tokens_version"]

    event = next(e for e in second["events"] if e["kind"] == "continued_pretraining")
    rows = {(r["set"], r["domain"]): r for r in json.loads(event["message"])["rows"]}
    # Scored before the first update, the initial run's validation set gives exactly the
    # initial run's last evaluation: same weights, same tokenizer, same validation tokens.
    last = first["evaluations"][-1]["metrics"]
    for domain in ("code", "docs", "math"):
        assert abs(rows["initial", domain]["before"] - last[f"loss/{domain}"]) < 1e-6
    assert set(k for k, _ in rows) == {"new", "initial"}
    new_math = rows["new", "math"]
    assert new_math["effect"] == "gain" and new_math["amount"] > 0
    assert new_math["after"] == second["evaluations"][-1]["metrics"]["loss/math"]
    # Training on math only: the code domain of the initial data is forgotten.
    assert rows["initial", "code"]["effect"] == "forgetting"
    assert rows["initial", "code"]["amount"] > 0
    kinds = [p["kind"] for p in second["phases"]]
    assert kinds.index("restore") < kinds.index("train")

    shown = ledgerlm("ledger", "show", "latest", "-w", ws).stdout
    assert "gain" in shown and "forgetting" in shown

    other = ledgerlm(
        "train", str(recipe), "--init-from", first["run"]["id"], "-w", ws,
        "--set", "model.d_model=32", check=False,
    )  # fmt: skip
    assert other.returncode == 2 and "model.d_model 64 != 32" in other.stderr
