"""The library refuses a bad argument by the argument's name (``ledgerlm.errors.
ArgumentError``); the scale commands word the same error with their flags, exactly as
they printed it when they checked the flags themselves."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ledgerlm.cli import scale_fit, scale_serving
from ledgerlm.cli.main import app
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.scaling.holdout import holdout_mask

SHAPE = "d_model=32,n_layers=1,vocab=64"


@pytest.fixture(scope="module")
def law_csv(tmp_path_factory):
    """Points of a known law: enough distinct (N, D) for a fit."""
    path = tmp_path_factory.mktemp("law") / "law.csv"
    rows = ["N,D,loss"]
    for n in (1e6, 3e6, 1e7, 3e7):
        for d in (1e8, 1e9, 1e10):
            rows.append(f"{n:g},{d:g},{1.7 + 400 * n**-0.34 + 410 * d**-0.28:.6f}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _error(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_the_library_names_its_arguments():
    with pytest.raises(ArgumentError) as bad:
        holdout_mask([1.0], [1.0], [1.0], holdout="C=>1e20")
    assert str(bad.value).startswith("holdout 'C=>1e20': expected QUANTITY OP NUMBER")
    worded = bad.value.worded({"holdout": "--holdout"})
    assert worded.startswith("--holdout 'C=>1e20': expected QUANTITY OP NUMBER")
    with pytest.raises(ArgumentError, match=r"^give exactly one source of points: sweep ID, runs"):
        load_points()
    with pytest.raises(ArgumentError, match=r"^n_col applies to csv only$"):
        load_points(sweep="x", columns={"n_col": "N"})


def test_scale_fit_names_its_flags(law_csv):
    csv = str(law_csv)
    assert _error("scale", "fit", "--csv", csv, "--holdout", "C=>1e20") == (
        "error: --holdout 'C=>1e20': expected QUANTITY OP NUMBER, e.g. C>=1e20 (quantities "
        "N, D, C, D/N, loss; operators >=, <=, >, <)"
    )
    assert _error("scale", "fit", "--csv", csv, "--sweep", "x") == (
        "error: give exactly one source of points: --sweep ID, --runs R1,R2,... or --csv FILE"
    )
    assert _error("scale", "fit", "--sweep", "x", "--lr-col", "lr") == (
        "error: --lr-col applies to --csv only"
    )
    assert _error("scale", "fit", "--csv", csv, "--drop-top-loss", "12") == (
        "error: --drop-top-loss 12: must be between 0 and 11"
    )


def test_scale_recommend_names_its_flags(law_csv, tmp_path):
    args = ("scale", "recommend", "--csv", str(law_csv), "--budget", "1e20", "--bootstrap", "0")
    both = ("--serving", str(tmp_path / "cost.json"), "--serving-flops-per-param", "3")
    assert _error(*args, *both) == (
        "error: give --serving FILE or --serving-flops-per-param K, not both"
    )


def test_scale_serving_cost_names_its_flags():
    assert _error("scale", "serving-cost", "somerun", "--model-shape", SHAPE) == (
        "error: give a RUN or --model-shape d_model=..,n_layers=..,vocab=.., not both"
    )
    assert _error("scale", "serving-cost", "--model-shape", "d_model=32,layers=2") == (
        "error: --model-shape: unknown key 'layers' (known: d_model, n_layers, n_heads, "
        "vocab, ffn_mult)"
    )


def test_a_command_without_the_flag_names_the_argument(monkeypatch, law_csv):
    # the mutation check: the flags come from the command's map, not from the library
    monkeypatch.delitem(scale_fit.FIT_FLAGS, "holdout")
    monkeypatch.delitem(scale_serving.SERVING_FLAGS, "shape")
    line = _error("scale", "fit", "--csv", str(law_csv), "--holdout", "C=>1e20")
    assert line.startswith("error: holdout 'C=>1e20': expected")
    line = _error("scale", "serving-cost", "--model-shape", "d_model=32,layers=2")
    assert line.startswith("error: shape: unknown key 'layers'")
