"""Whether a lifecycle row trains a model is decided once, by ``lab.scaling.recommend.
trains``: the recommendation flags only the rows that train, and ``scale recommend``
prints the others as serving that takes the whole budget."""

from __future__ import annotations

from typer.testing import CliRunner

from ledgerlm.cli.main import app
from ledgerlm.lab.scaling import recommend as recommend_module
from ledgerlm.lab.scaling.fit import FitOptions, fit
from ledgerlm.lab.scaling.points import load_points
from ledgerlm.lab.scaling.recommend import recommend, trains

STARVED = "serving the requests takes the whole budget; no model trains on even one token"


def _recommend(law_csv) -> str:
    args = ["scale", "recommend", "--csv", str(law_csv), "--budget", "1e20", "--requests",
            "0,1e9", "--bootstrap", "0"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_row_trains_on_at_least_one_token():
    assert trains({"D": 1.0}) and trains({"D": 2e9})
    assert not trains({"D": 0.5}) and not trains({"D": 0.0})


def test_the_recommendation_and_the_command_follow_the_one_rule(monkeypatch, law_csv):
    fitted = fit(load_points(csv=law_csv), FitOptions(n_boot=0))
    rows = recommend(fitted, 1e20, [0, 1e9])["lifecycle"]["rows"]
    assert all(trains(r) and r["extrapolation"] for r in rows)  # 1e20 is beyond the points
    assert STARVED not in _recommend(law_csv)
    # the mutation check: a rule that trains nothing reaches both, through the one function
    monkeypatch.setattr(recommend_module, "trains", lambda row: False)
    rows = recommend(fitted, 1e20, [0, 1e9])["lifecycle"]["rows"]
    assert all(r["extrapolation"] is None for r in rows)
    assert f"R = 0, 1e9: {STARVED}" in _recommend(law_csv)
