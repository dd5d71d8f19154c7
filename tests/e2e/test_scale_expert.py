"""``scale fit`` and ``scale recommend`` as an expert uses them, from the command line:
a public table read as it is, learning-rate replicates reduced, outliers and held-out
points listed, diagnostics, and a lifecycle table with intervals and flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cli_runner import ledgerlm
from ledgerlm.scaling.law import LawParams
from reference_data import REFERENCE_CSV

TRUE = LawParams(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)


def write_tuned_csv(path: Path) -> Path:
    """6 sizes x 5 token counts from ``TRUE``, each tried at three learning rates (the
    middle one best), in columns named as a user's table would name them."""
    rng = np.random.default_rng(0)
    lines = ["params,tokens,val_loss,learning_rate"]
    for n in np.logspace(7, 9, 6):
        for d in np.logspace(9, 11, 5):
            best = TRUE.predict(n, d) * np.exp(rng.normal(0, 0.005))
            for lr, worse in ((1e-3, 1.04), (3e-3, 1.0), (1e-2, 1.09)):
                lines.append(f"{n:.6g},{d:.6g},{best * worse:.6f},{lr}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def tuned_csv(tmp_path):
    return write_tuned_csv(tmp_path / "tuned.csv")


def _fit(*args):
    return json.loads(ledgerlm("scale", "fit", *args, "--bootstrap", "40", "--json").stdout)


def test_the_public_chinchilla_table_fits_as_it_is():
    if not REFERENCE_CSV.exists():
        pytest.skip(f"reference data absent: {REFERENCE_CSV}")
    out = _fit("--csv", str(REFERENCE_CSV), "--drop-top-loss", "5")
    assert out["columns"]["N"] == "Model Size" and out["n_loaded"] == 245
    assert out["n_points"] == 240 and len(out["dropped"]) == 5
    assert all("--drop-top-loss 5" in d["why"] for d in out["dropped"])
    # Besiroglu et al.'s replication: alpha 0.3473, beta 0.3672
    assert out["params"]["alpha"] == pytest.approx(0.3473, abs=0.002)
    assert out["params"]["beta"] == pytest.approx(0.3672, abs=0.002)
    assert out["isoflop"]["fitted"] and out["isoflop"]["grouped"] == 193
    shown = ledgerlm("scale", "fit", "--csv", str(REFERENCE_CSV), "--drop-top-loss", "5",
                     "--bootstrap", "20").stdout  # fmt: skip
    assert "left out of the fit" in shown and "identified" in shown


def test_replicates_are_reduced_to_the_best_learning_rate(tuned_csv):
    out = _fit("--csv", str(tuned_csv))
    assert out["reduction"]["how"] == "best"  # the rows carry differing learning rates
    assert out["reduction"]["rows_in"] == 90 and out["n_points"] == 30
    assert len(out["dropped"]) == 60
    assert out["params"]["alpha"] == pytest.approx(0.34, abs=0.05)
    kept_all = _fit("--csv", str(tuned_csv), "--reduce", "none")
    assert kept_all["n_points"] == 90 and kept_all["dropped"] == []
    # the worse learning rates pull the fitted E up when kept
    assert kept_all["params"]["E"] > out["params"]["E"]


def test_held_out_points_are_scored_with_their_bias(tuned_csv):
    out = _fit("--csv", str(tuned_csv), "--holdout", "C>=1e20")
    held = out["held_out"]
    assert held["rule"] == "C>=1e20" and held["n"] == len(held["points"]) > 0
    assert all(p["N"] * p["D"] * 6 >= 1e20 for p in held["points"])
    assert {"mae", "rmse", "bias", "max_rel_error"} <= set(held)
    assert held["mae"] < 0.05  # an exact law with 0.5% noise extrapolates well
    top = _fit("--csv", str(tuned_csv), "--holdout-top", "3")
    assert top["held_out"]["n"] == 3
    bad = ledgerlm("scale", "fit", "--csv", str(tuned_csv), "--holdout", "C=>1e20",
                   check=False)  # fmt: skip
    assert bad.returncode == 2 and "expected QUANTITY OP NUMBER" in bad.stderr


def test_a_bad_row_names_its_file_line_and_column(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("N,D,loss\n1e8,2e9,3.1\n1e8,oops,3.0\n")
    proc = ledgerlm("scale", "fit", "--csv", str(path), check=False)
    assert proc.returncode == 2
    assert f"{path}:3: column 'D': 'oops' is not a positive number" in " ".join(proc.stderr.split())


def test_recommend_flags_every_lifecycle_row_and_gives_its_interval(tuned_csv):
    out = json.loads(
        ledgerlm(
            "scale", "recommend", "--csv", str(tuned_csv),
            "--budget", "1e20", "--requests", "0,1e8,1e11", "--bootstrap", "30", "--json",
        ).stdout
    )  # fmt: skip
    rows = out["lifecycle"]["rows"]
    assert [r["R"] for r in rows] == [0, 1e8, 1e11]
    for r in rows:
        lo, hi = r["interval"]["N"]
        assert lo <= r["N"] <= hi and r["interval"]["n_valid"] == 30
    # the fitted runs train 1 to 10,000 tokens per parameter, N from 1e7 to 1e9: without
    # requests the optimum lies inside; 1e11 requests push N below 1e7 and D/N past 1e4
    assert rows[0]["extrapolation"] is None and rows[1]["extrapolation"] is None
    flag = rows[2]["extrapolation"]
    assert "N=" in flag and "D/N=" in flag and "above the fitted max 1e+04" in flag
    assert out["fit"]["diagnostics"]["status"] == "identified"
