"""The RegMix-style mixture search: small proxy runs on mixtures drawn around the
natural one, and the mixture a regression recommends.

``search_mixture`` runs ``trials`` proxy runs of a recipe (the base recipe with the
``proxy`` overrides): the first on the natural mixture (the baseline), the others on
mixtures drawn from a Dirichlet around it. Every trial is a ledger run named
``<search id>-t<index>`` with a ``mix_search`` event. A regression from the weights to
each domain's final validation loss (and the overall loss) is fitted on the trials,
cross-validated, and the mixture minimising the objective among many candidate draws
around the natural mixture is the result: ``loss`` (the overall validation loss),
``loss/<domain>``, or ``worst`` (the largest ratio of a domain's predicted loss to its
baseline loss). The result is kept in ``mixtures/<search id>.json`` with the search's
wall time (trials and fit), its device time and its bill (``ledger.search``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ledgerlm.config import Recipe
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.mix_search.proxy import proxy_recipe, trial_recipe
from ledgerlm.lab.mix_search.record import (
    SearchClock,
    search_id_of,
    search_plan,
    start_record,
    write_event,
)
from ledgerlm.ledger.events import MIX_SEARCH, latest
from ledgerlm.ledger.target import last_in_the_run
from ledgerlm.mixture.dirichlet import dirichlet_around
from ledgerlm.mixture.recommend import recommend
from ledgerlm.mixture.regress import fit_regression
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.train.distributed import one_process
from ledgerlm.workspace import Workspace, atomic_write_json

OBJECTIVES = ("loss", "worst")  # or loss/<domain>


@dataclass
class Trial:
    run_id: str
    weights: dict[str, float]
    metrics: dict[str, float]  # the final evaluation's (loss and loss/<domain>)
    seconds: float  # the run's wall time (all its phases)


def _objective_values(objective: str, preds: dict[str, np.ndarray], baseline: dict[str, float]):
    if objective == "loss" or objective.startswith("loss/"):
        return preds[objective]
    # worst: the largest ratio of a domain's loss to its baseline loss
    ratios = [preds[k] / baseline[k] for k in preds if k.startswith("loss/")]
    return np.max(np.stack(ratios), axis=0)


def check_objective(objective: str, domains: list[str]) -> None:
    if objective in OBJECTIVES:
        return
    if objective.startswith("loss/") and objective.split("/", 1)[1] in domains:
        return
    raise ValueError(
        f"objective {objective!r}: use loss, worst, or loss/<domain> "
        f"(domains: {', '.join(domains)})"
    )


def search_mixture(
    base: Recipe,
    workspace: Workspace,
    *,
    trials: int,
    proxy: list[str],
    objective: str = "loss",
    concentration: float | None = None,
    seed: int = 0,
    model: str = "auto",
    candidates: int = 100_000,
    progress: Progress | None = None,
    search_id: str | None = None,
) -> dict[str, Any]:
    """Run the proxy trials, fit the regressions, and keep the recommended mixture.

    Returns (and writes to ``mixtures/<search id>.json``) the search record: id,
    objective, natural mixture, trials (run, weights, final losses, seconds), the
    cross-validated regressions, the recommended mixture with its predicted losses, and
    the search's wall time, device time and bill. The id is ``search_id`` or the plan's own
    (``search_id_of``); the record is written before the first trial and again as each
    trial finishes (atomically, ``complete`` false until the fit), and each trial is
    continued (``lab.resume.continue_run``): running the same search again reuses the
    finished trials, resumes the interrupted one, and trains nothing twice.
    """
    one_process()  # under torchrun every rank would run the whole search
    from ledgerlm.lab.mixture import segments  # imports the token store
    from ledgerlm.lab.resume import continue_run  # the runner imports torch
    from ledgerlm.tokens.shards import TokenStore

    if trials < 3:
        raise ArgumentError("{trials} {given}: a regression needs at least 3 trials", given=trials)
    progress = progress or NullProgress()
    proxied = proxy_recipe(base, proxy)
    settings = {"trials": trials, "objective": objective, "concentration": concentration}
    settings.update(seed=seed, model=model, candidates=candidates)
    plan = search_plan(base, "regmix", proxy, **settings)
    search_id = search_id_of(base, plan, search_id)
    record = start_record(workspace, search_id, plan)
    if record["complete"]:
        return record
    clock = SearchClock(record, workspace)
    done: list[Trial] = []
    natural: dict[str, float] = {}
    domains: list[str] = []
    mixtures: np.ndarray | None = None
    with progress.task(f"mix search {search_id}", total=trials) as task:
        for i in range(trials):
            if i == 0:
                mix: Any = "natural"
            else:
                assert mixtures is not None
                mix = {d: float(w) for d, w in zip(domains, mixtures[i - 1], strict=True)}
            recipe = trial_recipe(proxied, f"{search_id}-t{i:02d}", mix)
            run = continue_run(recipe, workspace, progress)
            clock.trained(run)
            summary = run.summary
            if i == 0:
                store = TokenStore(run.tokens.path)
                domains = list(store.domains)
                check_objective(objective, domains)
                (seg,) = segments(recipe, store)
                natural = dict(seg.weights)
                center = np.array([natural[d] for d in domains])
                c = concentration if concentration is not None else float(len(domains))
                mixtures = dirichlet_around(center, c, trials - 1, seed)
                mix = natural
            last = last_in_the_run(summary)["metrics"]
            trial = Trial(run.run_id, dict(mix), dict(last), float(summary["total_seconds"]))
            done.append(trial)
            if run.how != "reused" or latest(summary, MIX_SEARCH) is None:
                message = {"search_id": search_id, "index": i, "of": trials}
                write_event(workspace, run.run_id, {**message, "weights": trial.weights})
            record.update(domains=domains, natural=natural, trials=[_trial_row(t) for t in done])
            clock.stamp(record, sum(t.seconds for t in done))
            atomic_write_json(workspace.search_file(search_id), record)
            info = f"t{i:02d} loss {last.get('loss', float('nan')):.4f}"
            task.advance(1, info=info if run.how == "started" else f"{info} ({run.how})")
    record.update(
        fit_search(
            done,
            domains,
            objective=objective,
            concentration=concentration if concentration is not None else float(len(domains)),
            seed=seed,
            model=model,
            candidates=candidates,
        )
    )
    record.update(base_recipe=base.name, proxy=proxy, complete=True)
    clock.stamp(record, sum(t.seconds for t in done))
    atomic_write_json(workspace.search_file(search_id), record)
    return record


def _trial_row(t: Trial) -> dict[str, Any]:
    return {"run": t.run_id, "weights": t.weights, "metrics": t.metrics, "seconds": t.seconds}


def fit_search(
    trials: list[Trial],
    domains: list[str],
    *,
    objective: str,
    concentration: float,
    seed: int = 0,
    model: str = "auto",
    candidates: int = 100_000,
) -> dict[str, Any]:
    """Regressions from the trials' weights to each final loss, and the mixture that
    minimises ``objective`` among ``candidates`` draws around the natural mixture (the
    first trial's). A pure function of the trials: tested without training."""
    check_objective(objective, domains)
    natural = trials[0].weights
    x = np.array([[t.weights.get(d, 0.0) for d in domains] for t in trials])
    targets = ["loss", *(f"loss/{d}" for d in domains)]
    fits = {}
    for name in targets:
        y = np.array([t.metrics[name] for t in trials], dtype=np.float64)
        fits[name] = fit_regression(x, y, domains, model=model, seed=seed)
    baseline = {name: float(trials[0].metrics[name]) for name in targets}

    def predict_all(w: np.ndarray) -> dict[str, np.ndarray]:
        return {name: fit.predict(w) for name, fit in fits.items()}

    def score(w: np.ndarray) -> np.ndarray:
        return _objective_values(objective, predict_all(w), baseline)

    center = np.array([natural[d] for d in domains])
    best = recommend(score, center, concentration, candidates=candidates, seed=seed)
    predicted = {k: float(v[0]) for k, v in predict_all(best[None, :]).items()}
    return {
        "objective": objective,
        "domains": domains,
        "natural": natural,
        "concentration": concentration,
        "trials": [_trial_row(t) for t in trials],
        "regressions": {name: fit.to_dict() for name, fit in fits.items()},
        "recommended": {d: float(w) for d, w in zip(domains, best, strict=True)},
        "predicted": predicted,
        "baseline": baseline,
    }
