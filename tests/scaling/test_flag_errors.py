"""The library refuses a bad argument by the argument's name (``ledgerlm.errors.
ArgumentError``); the scale commands word the same error with their flags, exactly as
they printed it when they checked the flags themselves."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ledgerlm.cli import scale_fit, scale_serving
from ledgerlm.cli.main import app
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.scaling.fit import FitOptions, fit
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.lab.scaling.recommend import check_budget, recommend
from ledgerlm.scaling.holdout import holdout_mask

SHAPE = "d_model=32,n_layers=1,vocab=64"


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


@pytest.mark.parametrize(
    ("options", "line"),
    [
        ({"reduce": "median"}, "reduce: expected one of best, mean, none, got 'median'"),
        ({"max_residual": 0.0}, "max_residual must be a positive number"),
        ({"max_residual": float("inf")}, "max_residual must be a positive number"),
    ],
)
def test_fit_options_are_refused_when_made(options, line):
    with pytest.raises(ArgumentError) as bad:
        FitOptions(**options)
    assert str(bad.value) == line


@pytest.mark.parametrize(
    ("args", "line"),
    [
        ((0.0,), "budget: 0.0 is not a positive number of FLOPs"),
        ((float("inf"),), "budget: inf is not a positive number of FLOPs"),
        ((1e20, "0,x"), "requests: 'x' is not a number"),
        ((1e20, "0,-1"), "requests: '-1' is not a number >= 0"),
        ((1e20, [0.0, float("inf")]), "requests: inf is not a number >= 0"),
        ((1e20, None, 0.0), "tokens_per_request must be a positive number"),
    ],
)
def test_a_budget_that_cannot_be_allocated_is_refused(args, line):
    with pytest.raises(ArgumentError) as bad:
        check_budget(*args)
    assert str(bad.value) == line


def test_recommend_checks_its_budget_and_requests(law_csv):
    fitted = fit(load_points(csv=law_csv), FitOptions(n_boot=0))
    with pytest.raises(ArgumentError, match=r"^budget: 0.0 is not a positive number of FLOPs$"):
        recommend(fitted, 0.0)
    with pytest.raises(ArgumentError, match=r"^requests: '-1' is not a number >= 0$"):
        recommend(fitted, 1e20, "0,-1")
    assert [r["R"] for r in recommend(fitted, 1e20, "0,1e6")["lifecycle"]["rows"]] == [0, 1e6]


def test_requests_are_read_as_numbers():
    assert check_budget(1e20) is None
    assert check_budget(1e20, "0, 1e6,1_000") == [0.0, 1e6, 1000.0]
    assert check_budget(1e20, [0, 5]) == [0.0, 5.0]


def test_scale_fit_names_its_flags(law_csv, tmp_path):
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
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text("size,spend\n1e8,2e9\n")
    assert _error("scale", "fit", "--csv", str(unnamed)) == (
        f"error: {unnamed}:1: missing column(s) for N (N or n or params or parameters or Model "
        "Size or model_size; or name it with --n-col); loss (loss or Loss or val_loss or "
        "final_loss; or name it with --loss-col); D or C (tokens or compute; --d-col or --c-col)"
    )
    assert _error("scale", "fit", "--csv", csv, "--reduce", "median") == (
        "error: --reduce: expected one of best, mean, none, got 'median'"
    )
    # refused before the points are read: the file does not exist
    assert _error("scale", "fit", "--csv", "missing.csv", "--max-residual", "-1") == (
        "error: --max-residual must be a positive number"
    )


def test_scale_recommend_names_its_flags(law_csv, tmp_path):
    args = ("scale", "recommend", "--csv", str(law_csv), "--budget", "1e20", "--bootstrap", "0")
    both = ("--serving", str(tmp_path / "cost.json"), "--serving-flops-per-param", "3")
    assert _error(*args, *both) == (
        "error: give --serving FILE or --serving-flops-per-param K, not both"
    )
    # refused before the points are read: the file does not exist
    ask = ("scale", "recommend", "--csv", str(tmp_path / "missing.csv"))
    assert _error(*ask, "--budget", "-1") == (
        "error: --budget: -1.0 is not a positive number of FLOPs"
    )
    assert _error(*ask, "--budget", "1e20", "--requests", "0,1e6,-1") == (
        "error: --requests: '-1' is not a number >= 0"
    )
    assert _error(*ask, "--budget", "1e20", "--tokens-per-request", "0") == (
        "error: --tokens-per-request must be a positive number"
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
