"""requirements S1-S4 through the CLI: a real 3 x 2 sweep of the tiny recipe on one data version,
its fit, and fit/recommend on a CSV written from known parameters."""

import csv
import json
import math

import numpy as np
import pytest

from ledgerlm.config import load_recipe
from ledgerlm.ledger import Ledger
from ledgerlm.scaling.allocate import compute_optimal
from ledgerlm.scaling.law import LawParams
from ledgerlm.scaling.sweep import plan as sweep_plan

from .conftest import TINY, ledgerlm

SIZES = "5e4,9e4,1.3e5"  # d48 L1, d64 L1, d64 L2: 52,368, 83,136, 133,440 parameters
TOKENS = "2e4,4e4"  # 20 and 40 steps of 1,024 tokens
TRUE = LawParams(E=1.8, A=300.0, B=900.0, alpha=0.32, beta=0.30)


@pytest.mark.slow
def test_a_sweep_runs_every_point_on_one_data_version_and_fits(tmp_path):
    ws = str(tmp_path)
    plan = [p.to_dict() for p in sweep_plan(load_recipe(TINY), [5e4, 9e4, 1.3e5], [2e4, 4e4])]
    assert [p["N"] for p in plan] == [52_368] * 2 + [83_136] * 2 + [133_440] * 2
    assert [p["max_steps"] for p in plan] == [20, 40] * 3

    args = ("--sizes", SIZES, "--tokens", TOKENS, "-w", ws)
    out = json.loads(ledgerlm("scale", "run", str(TINY), *args, "--json").stdout)
    sweep_id = out["sweep_id"]
    assert sweep_id.startswith("tiny-sweep-") and out["skipped"] == []
    assert [(p["N"], p["D"]) for p in out["points"]] == [
        (n, d) for n in (52_368, 83_136, 133_440) for d in (20_480, 40_960)
    ]
    runs = [p["run"] for p in out["points"]]
    # the sweep's bill: its runs by how they ended, kept with its plan
    bill = out["bill"]
    assert bill["total"]["trials"] == 6 and bill["groups"]["failed"]["trials"] == 0
    kept = json.loads((tmp_path / "sweeps" / f"{sweep_id}.json").read_text())
    assert kept["trials"] == runs and kept["bill"] == bill
    again = ledgerlm("scale", "run", str(TINY), *args).stdout  # every point reused
    assert f"scaling sweep {sweep_id}: 6 trials" in again and "not reached" in again

    with Ledger(tmp_path / "ledger.db") as ledger:
        wall = sum(ledger.run_summary(r)["total_seconds"] for r in runs)
        assert bill["total"]["seconds"] == pytest.approx(wall) == kept["seconds"]
        listed = {r["id"]: r for r in ledger.list_runs()}
        assert set(listed) == set(runs)
        # one data version and one tokens version for the whole sweep
        assert {(r["data_version"], r["tokens_version"]) for r in listed.values()} == {
            (out["data_version"], out["tokens_version"])
        }
        for i, (run, planned) in enumerate(zip(runs, plan, strict=True)):
            s = ledger.run_summary(run)
            assert run.startswith(f"{sweep_id}-{planned['name']}-")
            recipe = s["run"]["recipe"]
            assert recipe["model"]["d_model"] == planned["d_model"]
            assert recipe["eval"]["stop_at_target"] is False
            # the whole curve: every interval and the final step, no early stop
            steps = [e["step"] for e in s["evaluations"]]
            every = math.ceil(planned["max_steps"] / 8)
            expected = [*range(every, planned["max_steps"], every), planned["max_steps"]]
            assert steps == expected
            assert s["counters"]["optimizer_updates"] == planned["max_steps"]
            assert s["steps_recorded"]["updates"] == planned["max_steps"]
            event = json.loads(next(e["message"] for e in s["events"] if e["kind"] == "sweep"))
            assert event["sweep_id"] == sweep_id and event["index"] == i
            assert event["point"]["overrides"] == planned["overrides"]
            assert event["point"]["rule"]["lr_rule"] == "fixed"
            assert event["data_version"] == out["data_version"]
            reused = [
                p["detail"]["reused"] for p in s["phases"] if p["kind"] in ("prep", "tokenize")
            ]
            assert reused == ([False, False] if i == 0 else [True, True])  # prepared once

    fit = json.loads(
        ledgerlm(
            "scale", "fit", "--sweep", sweep_id, "--bootstrap", "20", "--json", "-w", ws
        ).stdout
    )
    assert fit["n_points"] == 6 and fit["source"] == {"sweep": sweep_id}
    assert fit["reduction"]["how"] == "none" and fit["dropped"] == []  # one lr per point
    assert all(math.isfinite(v) for v in fit["params"].values())
    assert set(fit["intervals"]) == {"E", "A", "B", "alpha", "beta"}
    assert fit["range"]["N"] == [52_368, 133_440] and fit["range"]["D"] == [20_480, 40_960]
    assert fit["warnings"]  # 6 points for 5 parameters is said to be barely enough

    # four points cannot determine five parameters: one clear line, exit 2
    proc = ledgerlm("scale", "fit", "--runs", ",".join(runs[:4]), "-w", ws, check=False)
    assert proc.returncode == 2
    assert "needs at least 5 points with distinct (N, D), got 4" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture
def law_csv(tmp_path):
    N, D = (a.ravel() for a in np.meshgrid(np.geomspace(1e5, 1e7, 5), np.geomspace(1e7, 1e9, 4)))
    path = tmp_path / "points.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["N", "D", "loss"])
        w.writerows(zip(N, D, TRUE.predict(N, D), strict=True))
    return path


def test_fit_and_recommend_from_a_csv_of_known_parameters(law_csv):
    page = law_csv.with_name("fit.html")
    args = ("--csv", str(law_csv), "--bootstrap", "30", "--report", str(page), "--json")
    fit = json.loads(ledgerlm("scale", "fit", *args).stdout)
    assert fit["n_points"] == 20 and fit["warnings"] == []
    html = page.read_text()
    assert fit["report"] == str(page) and html.count('class="figure-spec"') >= 2
    assert 'src="http' not in html  # self-contained: plotly.js is inlined
    for name, value in TRUE.to_dict().items():
        assert fit["params"][name] == pytest.approx(value, rel=1e-3)
        lo, hi = fit["intervals"][name]
        assert lo <= fit["params"][name] * (1 + 1e-6) and hi >= fit["params"][name] * (1 - 1e-6)
    assert fit["residual_rms_log"] < 1e-6
    assert fit["range"]["C"] == pytest.approx([6e12, 6e16])

    text = ledgerlm(
        "scale",
        "recommend",
        "--csv",
        str(law_csv),
        "--budget",
        "1e16",
        "--requests",
        "0,1e6,1e8",
        "--tokens-per-request",
        "1000",
        "--bootstrap",
        "30",
    ).stdout
    n_opt, d_opt = (float(x) for x in compute_optimal(TRUE, 1e16))
    assert f"N* = {n_opt:.4g}, D* = {d_opt:.4g}" in text
    assert "inside the fitted range (no extrapolation)" in text
    assert "lifecycle: training + R requests of 1,000 tokens (2 N FLOPs a token) within C" in text
    rows = [line.split("│")[0].strip(" !") for line in text.splitlines() if "│" in line]
    assert {"0", "1e6", "1e8"} <= set(rows)  # one lifecycle row per R

    out = json.loads(
        ledgerlm(
            "scale",
            "recommend",
            "--csv",
            str(law_csv),
            "--budget",
            "1e19",
            "--requests",
            "0,1e6,1e8",
            "--bootstrap",
            "30",
            "--json",
        ).stdout
    )
    n_opt, d_opt = (float(x) for x in compute_optimal(TRUE, 1e19))
    assert out["N_opt"]["point"] == pytest.approx(n_opt, rel=1e-3)
    assert out["D_opt"]["point"] == pytest.approx(d_opt, rel=1e-3)
    assert out["N_opt"]["lo"] <= out["N_opt"]["point"] <= out["N_opt"]["hi"]
    assert "extrapolation: C=1e+19" in out["extrapolation"]
    rows = out["lifecycle"]["rows"]
    assert [r["R"] for r in rows] == [0, 1e6, 1e8]
    assert rows[0]["N"] == pytest.approx(n_opt, rel=1e-6)
    # more future requests: a smaller model trained on more tokens, same total budget
    assert rows[0]["N"] > rows[1]["N"] > rows[2]["N"]
    assert rows[0]["D"] < rows[1]["D"] < rows[2]["D"]
    assert all(r["C_train"] + r["C_inference_total"] == pytest.approx(1e19) for r in rows)


def test_plan_prints_the_points_and_the_rules_and_refuses_bad_ones(tmp_path, law_csv):
    args = ("--sizes", "2e5,5e5", "--flops", "1e11,3e11", "--lr-rule", "sqrt")
    text = ledgerlm("scale", "plan", str(TINY), *args).stdout
    assert "sweep plan: 4 runs of tiny" in text
    assert "N200k-D84k" in text and "d80 L2 h5" in text  # D = C / (6 N), whole steps
    assert "targets: N 2e5, 5e5; C 1e11, 3e11" in text
    assert "lr rule sqrt: lr = base lr x sqrt(base d_model / d_model)" in text
    assert "stop_at_target = false" in text

    proc = ledgerlm("scale", "plan", str(TINY), "--sizes", "5e3", "--tokens", "1e5", check=False)
    assert proc.returncode == 2 and "below the smallest shape" in proc.stderr
    proc = ledgerlm("scale", "fit", "--csv", str(law_csv), "--sweep", "x", check=False)
    assert proc.returncode == 2 and "exactly one source of points" in proc.stderr
    proc = ledgerlm("scale", "fit", "--sweep", "nope", "-w", str(tmp_path), check=False)
    assert proc.returncode == 2 and "no ledger here" in proc.stderr


def test_every_scale_command_explains_itself():
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app

    runner = CliRunner()
    for args, phrase in (
        ([], "Scaling sweeps"),
        (["plan"], "Shape rule"),
        (["run"], "one data version"),
        (["fit"], "at least 5 distinct"),
        (["recommend"], "lifecycle table"),
    ):
        result = runner.invoke(app, ["scale", *args, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "Usage" in result.output, args
        assert phrase in " ".join(result.output.split()), args
