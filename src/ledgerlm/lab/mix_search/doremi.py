"""The DoReMi-style mixture search: a reference proxy run on the natural mixture, and
a proxy run that reweights its sampling at each evaluation on the domains' excess
validation loss over the reference (``doremi_search``, ``DoReMiCallback``)."""

from __future__ import annotations

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
from ledgerlm.ledger.mixture import plan_event
from ledgerlm.ledger.target import in_the_run, last_in_the_run
from ledgerlm.mixture.doremi import ETA, SMOOTHING, doremi_update, excess_loss
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.train.distributed import one_process
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.workspace import Workspace, atomic_write_json


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
    plan = search_plan(base, "doremi", proxy, eta=ETA, smoothing=SMOOTHING)
    search_id = search_id_of(base, plan, search_id)
    record = start_record(workspace, search_id, plan)
    if record["complete"]:
        return record
    clock = SearchClock(record, workspace)
    proxied = proxy_recipe(base, proxy)
    ref = continue_run(trial_recipe(proxied, f"{search_id}-ref", "natural"), workspace, progress)
    clock.trained(ref)
    ref_last = last_in_the_run(ref.summary)["metrics"]
    domains = sorted(k.split("/", 1)[1] for k in ref_last if k.startswith("loss/"))
    own = in_the_run(ref.summary["phases"], ref.summary["evaluations"])
    reference = {int(e["step"]): e["metrics"] for e in own}
    ref_row = {"run": ref.run_id, "seconds": float(ref.summary["total_seconds"])}
    record.update(domains=domains, trials=[ref_row])
    clock.stamp(record, ref_row["seconds"])
    atomic_write_json(workspace.search_file(search_id), record)
    reweighting = DoReMiCallback(domains, reference)
    uniform = {d: 1.0 / len(domains) for d in domains}
    trial = trial_recipe(proxied, f"{search_id}-proxy", uniform)
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
        write_event(
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
                "metrics": ref_last,
            },
            "proxy_run": {
                "run": run.run_id,
                "metrics": last_in_the_run(run.summary)["metrics"],
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
