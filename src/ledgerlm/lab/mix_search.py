"""Mixture search with small proxy runs (RegMix style) and the use of its result.

``search_mixture`` runs ``trials`` proxy runs of a recipe (the base recipe with the
``proxy`` overrides): the first on the natural mixture (the baseline), the others on
mixtures drawn from a Dirichlet around it. Every trial is a ledger run named
``<search id>-t<index>`` with a ``mix_search`` event. A regression from the weights to
each domain's final validation loss (and the overall loss) is fitted on the trials,
cross-validated, and the mixture minimising the objective among many candidate draws
around the natural mixture is the result: ``loss`` (the overall validation loss),
``loss/<domain>``, or ``worst`` (the largest ratio of a domain's predicted loss to its
baseline loss). The result is kept in ``mixtures/<search id>.json`` with the search's
wall time (trials and fit).

A run uses a result with ``data.mixture.from_search``: ``lab.mixture.use_search``
replaces the recipe's weights with the recommended ones before the run is created, and the run
records the search's wall time as a ``search`` phase, so its time-to-target includes
the cost of the decision.
"""

from __future__ import annotations

import hashlib
import json
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.config import (
    NAME_MAX,
    NAME_RULE,
    Recipe,
    RecipeError,
    apply_overrides,
    is_name,
    recipe_from_dict,
    shown,
)
from ledgerlm.errors import ArgumentError
from ledgerlm.ledger.events import MIX_SEARCH, latest
from ledgerlm.ledger.mixture import plan_event
from ledgerlm.ledger.store import Ledger
from ledgerlm.mixture.dirichlet import dirichlet_around
from ledgerlm.mixture.doremi import ETA, SMOOTHING, doremi_update, excess_loss
from ledgerlm.mixture.recommend import recommend
from ledgerlm.mixture.regress import fit_regression
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.train.distributed import one_process
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.workspace import Workspace, atomic_write_json, read_json

OBJECTIVES = ("loss", "worst")  # or loss/<domain>


@dataclass
class Trial:
    run_id: str
    weights: dict[str, float]
    metrics: dict[str, float]  # the final evaluation's (loss and loss/<domain>)
    seconds: float  # the run's wall time (all its phases)


def proxy_recipe(base: Recipe, proxy: list[str]) -> Recipe:
    """The base recipe with the ``proxy`` overrides; a proxy trains to its budget (no
    stop at the target) so the trials' final losses are comparable."""
    tree = apply_overrides(base.to_dict(), [*proxy, "eval.stop_at_target=false"])
    try:
        proxied = recipe_from_dict(tree, "proxy")
    except RecipeError as exc:  # "proxy: <key>: <why>", the argument named as such
        raise ArgumentError("{proxy}{rest}", rest=str(exc).removeprefix("proxy")) from None
    same_data = proxied.data.model_dump(exclude={"mixture"}) == base.data.model_dump(
        exclude={"mixture"}
    )
    if not same_data or proxied.tokenizer != base.tokenizer:
        raise ArgumentError(
            "{proxy} may not change [data] or [tokenizer]: the trials must share the data "
            "and token versions that the target run uses"
        )
    return proxied


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


def _write_event(workspace: Workspace, run_id: str, message: dict[str, Any]) -> None:
    with Ledger(workspace.ledger_path) as ledger:
        ledger.add_event(run_id, MIX_SEARCH, json.dumps(message))


def search_id_of(base: Recipe, plan: dict[str, Any], name: str | None = None) -> str:
    """The search's id: ``name`` when given, else ``<recipe>-mix-<6 hex>`` of the plan's
    hash (``plan_digest``): the same command gets the same id, so it continues."""
    found = name or f"{base.name}-mix-{plan_digest(plan)[:6]}"
    if not is_name(found) or len(f"{found}-proxy") > NAME_MAX:
        raise ValueError(
            f"search id {shown(found)}: expected a name of {NAME_RULE} (its trials add "
            "up to 6 characters)"
        )
    return found


def plan_digest(plan: dict[str, Any]) -> str:
    """A hash of what determines a search: the base recipe's digest (its seed included)
    and the search's settings (method, proxy overrides, trials, draws, fit)."""
    blob = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _plan(base: Recipe, method: str, proxy: list[str], **settings: Any) -> dict[str, Any]:
    return {"method": method, "base_recipe_sha256": base.digest(), "proxy": proxy, **settings}


def start_record(workspace: Workspace, search_id: str, plan: dict[str, Any]) -> dict[str, Any]:
    """The search's record in ``mixtures/<search id>.json``: read back (it must hold the
    same plan) when the search ran before, else written now, before its first trial, with
    no trial yet and ``complete`` false."""
    path = workspace.search_file(search_id)
    digest = plan_digest(plan)
    if path.is_file():
        try:
            record = read_json(path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a search record ({exc})") from None
        if not isinstance(record, dict) or record.get("plan_sha256") != digest:
            raise ArgumentError(
                "{path}: search {id} was planned from another recipe or settings; run it "
                "with the same recipe and flags, or give this one another {search_id}",
                path=path,
                id=search_id,
            )
        return record
    record = {
        "search_id": search_id,
        "plan": plan,
        "plan_sha256": digest,
        "complete": False,
        "trials": [],
        "trial_seconds": 0.0,
        "other_seconds": 0.0,
        "seconds": 0.0,
    }
    atomic_write_json(path, record)
    return record


class _Clock:
    """The search's wall time over every command that worked on it: its trials' time as
    the ledger charges each run (a killed run's time up to its last heartbeat included,
    the time between the kill and the resume not), plus the time around them (versions,
    the fit) that each command spent, as of its last write."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.started = time.perf_counter()
        self.before = float(record.get("other_seconds", 0.0))
        self.work = 0.0  # this command's seconds inside the trials it trained

    def trained(self, run: Any) -> None:
        self.work += float(run.summary["total_seconds"]) - run.seconds_before

    def stamp(self, record: dict[str, Any], trial_seconds: float) -> None:
        other = self.before + time.perf_counter() - self.started - self.work
        record.update(
            trial_seconds=trial_seconds, other_seconds=other, seconds=trial_seconds + other
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
    the search's wall time. The id is ``search_id`` or the plan's own
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
    plan = _plan(base, "regmix", proxy, **settings)
    search_id = search_id_of(base, plan, search_id)
    record = start_record(workspace, search_id, plan)
    if record["complete"]:
        return record
    clock = _Clock(record)
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
            recipe = _trial(proxied, f"{search_id}-t{i:02d}", mix)
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
            last = summary["evaluations"][-1]["metrics"]
            trial = Trial(run.run_id, dict(mix), dict(last), float(summary["total_seconds"]))
            done.append(trial)
            if run.how != "reused" or latest(summary, MIX_SEARCH) is None:
                message = {"search_id": search_id, "index": i, "of": trials}
                _write_event(workspace, run.run_id, {**message, "weights": trial.weights})
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


def _trial(proxied: Recipe, name: str, mix: Any) -> Recipe:
    tree = proxied.to_dict()
    tree["name"] = name
    tree["data"]["mixture"] = {**tree["data"]["mixture"], "weights": mix, "stages": []}
    return recipe_from_dict(tree, name)


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


def read_mixture(workspace: Workspace, ref: str) -> tuple[dict[str, float] | None, str | None]:
    """``--mixture``: a JSON or TOML file of {domain: weight} (or a search record's
    ``recommended``), else a search id (unique prefix, latest). Returns (weights, None)
    for a file and (None, search id) for a search."""
    path = Path(ref)
    if not path.is_file():
        return None, workspace.resolve_search(ref)
    text = path.read_text(encoding="utf-8")
    try:
        found = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {err}") from None
    if isinstance(found, dict) and isinstance(found.get("recommended"), dict):
        found = found["recommended"]
    if isinstance(found, dict) and "data" in found:  # a recipe: its [data.mixture] weights
        found = found["data"].get("mixture", {}).get("weights")
    if not isinstance(found, dict) or not found:
        raise ValueError(f"{path}: expected a table of domain = weight")
    try:
        weights = {str(d): float(w) for d, w in found.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{path}: every weight must be a number") from None
    total = sum(weights.values())
    if abs(total - 1) > 1e-3 or min(weights.values()) < 0:
        raise ValueError(f"{path}: weights must be >= 0 and sum to 1 (they sum to {total:g})")
    return {d: w / total for d, w in weights.items()}, None


def verify_mixture(
    base: Recipe,
    workspace: Workspace,
    mixture: str,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The target-scale run with the recipe's own mixture (the baseline) and with the
    found one, on the same budget (both train to it: no stop at the target, so the final
    losses compare like for like; the time-to-target is still the first confirmation).
    With a search id the found run is charged the search's wall time.

    Returns both run ids, the per-domain final validation loss of each with the change
    (negative: the found mixture is better there), and each run's time-to-target.
    """
    one_process()  # under torchrun every rank would run the whole search
    from ledgerlm.lab.run import run_recipe  # the runner imports torch

    progress = progress or NullProgress()
    weights, search_id = read_mixture(workspace, mixture)
    tree = apply_overrides(base.to_dict(), ["eval.stop_at_target=false"])
    baseline = recipe_from_dict({**tree, "name": f"{base.name}-baseline"}, "mix verify")
    found_tree = json.loads(json.dumps(tree))
    found_tree["name"] = f"{base.name}-mixed"
    found_mix = found_tree["data"]["mixture"]
    found_mix["stages"] = []
    if search_id is not None:
        found_mix.update(weights="natural", from_search=search_id)
    else:
        found_mix.update(weights=weights, from_search=None)
    found = recipe_from_dict(found_tree, "mix verify")
    results = {}
    for label, recipe in (("baseline", baseline), ("found", found)):
        results[label] = run_recipe(recipe, workspace, progress)
    rows = []
    finals = {k: r.summary["evaluations"][-1]["metrics"] for k, r in results.items()}
    names = sorted({k for m in finals.values() for k in m if k.startswith("loss/")})
    for name in ["loss", *names]:
        a, b = finals["baseline"].get(name), finals["found"].get(name)
        rows.append(
            {
                "domain": "all" if name == "loss" else name.split("/", 1)[1],
                "baseline": a,
                "found": b,
                "delta": None if a is None or b is None else b - a,
            }
        )
    return {
        "mixture": weights if weights is not None else {"search": search_id},
        "runs": {k: r.run_id for k, r in results.items()},
        "domains": rows,
        "time_to_target": {k: r.summary["time_to_target"] for k, r in results.items()},
        "search_seconds": {
            k: r.summary["phase_totals"].get("search", 0.0) for k, r in results.items()
        },
    }


class DoReMiCallback:
    """At each evaluation of the proxy, one DoReMi update of the sampling weights from
    the per-domain excess validation loss over the reference run at the same step; the
    weights in force over each interval are kept (``history``) for the average."""

    def __init__(self, domains: list[str], reference: dict[int, dict[str, float]]) -> None:
        self.domains, self.reference = domains, reference
        self.alpha = np.full(len(domains), 1.0 / len(domains))
        self.history: list[dict[str, Any]] = []
        self._seen = 0

    def on_train_start(self, trainer: Any) -> None:
        pass

    def on_step_end(self, trainer: Any) -> None:
        evaluator = next(cb for cb in trainer.callbacks if isinstance(cb, EvalCallback))
        if len(evaluator.history) == self._seen:
            return
        self._seen = len(evaluator.history)
        last = evaluator.history[-1]
        ref = self.reference.get(int(last["step"]))
        if ref is None:  # the reference was not evaluated at this step
            return
        proxy = np.array([last["metrics"][f"loss/{d}"] for d in self.domains])
        excess = excess_loss(proxy, np.array([ref[f"loss/{d}"] for d in self.domains]))
        self.history.append(
            {"step": int(last["step"]), "weights": self.alpha.tolist(), "excess": excess.tolist()}
        )
        self.alpha = doremi_update(self.alpha, excess)
        trainer.batches.reweight(self.alpha)

    def on_train_end(self, trainer: Any) -> None:
        pass

    def averaged(self) -> np.ndarray:
        """The weights averaged over the intervals (the initial uniform one included)."""
        rows = [h["weights"] for h in self.history] + [self.alpha.tolist()]
        mean = np.mean(np.array(rows), axis=0)
        return mean / mean.sum()


def doremi_search(
    base: Recipe,
    workspace: Workspace,
    *,
    proxy: list[str],
    progress: Progress | None = None,
    search_id: str | None = None,
) -> dict[str, Any]:
    """DoReMi-style search: a reference proxy run on the natural mixture, then a proxy run
    that starts from uniform weights and, at each evaluation, reweights its sampling by
    exponentiated gradient on the domains' excess validation loss over the reference at
    the same step (eta = 1, smoothing 1e-3). The result is the average of the weights
    over the intervals. Both runs are ledger runs of the search (``-ref``, ``-proxy``).

    Per-domain excess loss is measured on the fixed validation set at the evaluation
    interval, not per training batch as in the paper.

    Ids and records as ``search_mixture``: running it again reuses a finished run, resumes
    an interrupted reference, and restarts an interrupted proxy from step 0 in the same
    ledger run (its reweighting state is in no checkpoint; its recorded evaluations are
    reused where the weights match).
    """
    one_process()  # under torchrun every rank would run the whole search
    from ledgerlm.lab.resume import continue_run  # the runner imports torch

    progress = progress or NullProgress()
    plan = _plan(base, "doremi", proxy, eta=ETA, smoothing=SMOOTHING)
    search_id = search_id_of(base, plan, search_id)
    record = start_record(workspace, search_id, plan)
    if record["complete"]:
        return record
    clock = _Clock(record)
    proxied = proxy_recipe(base, proxy)
    ref = continue_run(_trial(proxied, f"{search_id}-ref", "natural"), workspace, progress)
    clock.trained(ref)
    domains = sorted(k.split("/", 1)[1] for k in ref.summary["evaluations"][-1]["metrics"]
                     if k.startswith("loss/"))  # fmt: skip
    reference = {int(e["step"]): e["metrics"] for e in ref.summary["evaluations"]}
    ref_row = {"run": ref.run_id, "seconds": float(ref.summary["total_seconds"])}
    record.update(domains=domains, trials=[ref_row])
    clock.stamp(record, ref_row["seconds"])
    atomic_write_json(workspace.search_file(search_id), record)
    reweighting = DoReMiCallback(domains, reference)
    uniform = {d: 1.0 / len(domains) for d in domains}
    trial = _trial(proxied, f"{search_id}-proxy", uniform)
    run = continue_run(trial, workspace, progress, callbacks=[reweighting], restart=True)
    if run.how == "reused":
        raise ArgumentError(
            "search {id}: its proxy run {run} finished but the record was not written, so "
            "its reweighting is lost; give the search another {search_id}",
            id=search_id,
            run=run.run_id,
        )
    clock.trained(run)
    for i, result in enumerate((ref, run)):
        _write_event(
            workspace,
            result.run_id,
            {"search_id": search_id, "index": i, "of": 2, "method": "doremi"},
        )
    averaged = reweighting.averaged()
    trials = [ref_row, {"run": run.run_id, "seconds": float(run.summary["total_seconds"])}]
    record.update(
        {
            "search_id": search_id,
            "method": "doremi",
            "base_recipe": base.name,
            "proxy": proxy,
            "domains": domains,
            "natural": {d: float(w) for d, w in zip(domains, _natural(ref), strict=True)},
            "eta": ETA,
            "smoothing": SMOOTHING,
            "reference": {
                "run": ref.run_id,
                "metrics": ref.summary["evaluations"][-1]["metrics"],
            },
            "proxy_run": {
                "run": run.run_id,
                "metrics": run.summary["evaluations"][-1]["metrics"],
            },
            "history": reweighting.history,
            "recommended": {d: float(w) for d, w in zip(domains, averaged, strict=True)},
            "objective": "excess loss (DoReMi)",
            "trials": trials,
            "complete": True,
        }
    )
    clock.stamp(record, sum(t["seconds"] for t in trials))
    atomic_write_json(workspace.search_file(search_id), record)
    return record


def _natural(result: Any) -> list[float]:
    """The natural shares a run planned (its recorded mixture plan)."""
    planned = plan_event(result.summary) or {"domains": []}
    return [d["weight"] for d in sorted(planned["domains"], key=lambda d: d["domain"])]
