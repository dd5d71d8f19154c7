"""The search's fit and choice (pure functions of the trials), reading a mixture file,
and a run charged for the search whose mixture it uses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ledgerlm.config import recipe_from_dict
from ledgerlm.lab.mix_search.regmix import Trial, check_objective, fit_search
from ledgerlm.lab.mix_search.verify import read_mixture
from ledgerlm.lab.mixture import use_search
from ledgerlm.mixture.dirichlet import dirichlet_around
from ledgerlm.workspace import Workspace, atomic_write_json

DOMAINS = ["code", "docs", "math"]
NATURAL = {"code": 0.6, "docs": 0.3, "math": 0.1}


def _losses(w: np.ndarray) -> dict[str, float]:
    """A known world: each domain's loss falls with its own weight (log law)."""
    per = {d: 3.0 - 0.5 * np.log(w[i] + 0.02) for i, d in enumerate(DOMAINS)}
    return {
        "loss": float(np.mean(list(per.values()))),
        **{f"loss/{d}": float(v) for d, v in per.items()},
    }


def _trials(n: int) -> list[Trial]:
    center = np.array([NATURAL[d] for d in DOMAINS])
    draws = np.vstack([center, dirichlet_around(center, 3.0, n - 1, seed=1)])
    return [
        Trial(f"t{i}", dict(zip(DOMAINS, map(float, w), strict=True)), _losses(w), 1.0)
        for i, w in enumerate(draws)
    ]


def test_the_search_recommends_the_mixture_the_world_rewards():
    trials = _trials(64)
    record = fit_search(trials, DOMAINS, objective="loss", concentration=3.0, candidates=20_000)
    rec = np.array([record["recommended"][d] for d in DOMAINS])
    assert abs(rec.sum() - 1) < 1e-9
    assert record["regressions"]["loss"]["model"] == "lightgbm"
    assert record["regressions"]["loss"]["cv"]["spearman"] > 0.8
    # the true average loss of the recommendation closes most of the gap between the
    # natural mixture's and the best one's (the even mixture, in this world)
    natural, best = trials[0].metrics["loss"], _losses(np.full(3, 1 / 3))["loss"]
    assert _losses(rec)["loss"] < natural - 0.7 * (natural - best)
    assert record["baseline"] == trials[0].metrics and record["natural"] == NATURAL


def test_a_domain_objective_raises_that_domains_weight():
    trials = _trials(64)
    record = fit_search(
        trials, DOMAINS, objective="loss/math", concentration=3.0, candidates=20_000
    )
    assert record["recommended"]["math"] > 2 * NATURAL["math"]


def test_the_worst_domain_objective_protects_every_domain():
    trials = _trials(64)
    base = trials[0].metrics

    def worst(objective: str) -> float:
        record = fit_search(
            trials, DOMAINS, objective=objective, concentration=3.0, candidates=20_000
        )
        rec = np.array([record["recommended"][d] for d in DOMAINS])
        return max(_losses(rec)[f"loss/{d}"] / base[f"loss/{d}"] for d in DOMAINS)

    # minimising the average sacrifices code (its loss rises ~4% over the natural
    # mixture's); minimising the worst ratio keeps every domain near its baseline
    by_loss, by_worst = worst("loss"), worst("worst")
    assert by_loss > 1.03 and by_worst < 1.015 and by_worst < by_loss - 0.02


@pytest.mark.parametrize("objective", ["loss/web", "mean", "loss/"])
def test_an_unknown_objective_is_refused(objective):
    with pytest.raises(ValueError, match="use loss, worst, or loss/<domain>"):
        check_objective(objective, DOMAINS)


def test_a_run_using_a_search_gets_its_weights_and_names_it(tmp_path):
    ws = Workspace(tmp_path)
    atomic_write_json(
        ws.search_file("r-mix-abc123"),
        {
            "search_id": "r-mix-abc123",
            "recommended": {"code": 0.5, "math": 0.5000001},
            "seconds": 9,
        },
    )
    recipe = recipe_from_dict({"data": {"mixture": {"from_search": "r-mix"}}})
    used, record = use_search(recipe, ws)
    assert record["seconds"] == 9
    assert used.data.mixture.from_search == "r-mix-abc123"
    assert sum(used.data.mixture.weights.values()) == pytest.approx(1, abs=1e-12)
    again, _ = use_search(used, ws)  # the stored recipe resolves to itself (a resume)
    assert again == used
    both = recipe_from_dict(
        {"data": {"mixture": {"from_search": "r-mix", "weights": {"code": 1.0}}}}
    )
    with pytest.raises(ValueError, match="not both"):
        use_search(both, ws)
    with pytest.raises(FileNotFoundError, match="no mixture search matches 'zzz'"):
        use_search(recipe_from_dict({"data": {"mixture": {"from_search": "zzz"}}}), ws)


def test_a_mixture_file_is_json_toml_or_a_search_record(tmp_path):
    ws = Workspace(tmp_path)
    (tmp_path / "m.json").write_text(json.dumps({"code": 0.25, "math": 0.75}))
    (tmp_path / "m.toml").write_text("code = 0.5\nmath = 0.5\n")
    (tmp_path / "s.json").write_text(json.dumps({"recommended": {"code": 1.0}}))
    (tmp_path / "bad.json").write_text(json.dumps({"code": 0.5}))
    assert read_mixture(ws, str(tmp_path / "m.json")) == ({"code": 0.25, "math": 0.75}, None)
    assert read_mixture(ws, str(tmp_path / "m.toml"))[0] == {"code": 0.5, "math": 0.5}
    assert read_mixture(ws, str(tmp_path / "s.json"))[0] == {"code": 1.0}
    with pytest.raises(ValueError, match="sum to 1"):
        read_mixture(ws, str(tmp_path / "bad.json"))
