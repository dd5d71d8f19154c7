"""Running a scaling sweep and reading its points back (SPEC S1).

The plan (shape, token and tuning rules, what N counts) is ``ledgerlm.scaling.sweep``;
this module joins it to the runner and the ledger.

**Running.** ``run_sweep`` runs every planned point, one after another, on one data
version: the first run prepares (or reuses) the data and tokens versions, every later
run must reuse exactly those. Each run is named ``<sweep id>-<point>`` and gets a
``sweep`` event (JSON: sweep id, index, point, overrides, tuning rule, realized N,
versions), also when it fails. The runner (and so torch) is imported only when a sweep
runs; reading points back needs neither.

**Reading back.** ``sweep_points`` gives the (N, D, loss) points of a sweep (``find_sweep``:
an id, a unique prefix or ``latest``) or of a list of runs: N as the run's ``sweep`` event
recorded it (else counted from its recipe and trained vocabulary), D the tokens the run
consumed (the ledger's ``tokens`` counter, padding excluded), loss its last evaluation.
Runs with no final point (failed, still running) are listed as skipped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ledgerlm.config import NAME_MAX, NAME_RULE, Recipe, is_name, shown
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.scaling.sweep import (
    EVENT,
    SWEEP_ID,
    PlanPoint,
    SweepError,
    new_sweep_id,
    param_count,
)
from ledgerlm.workspace import Workspace

# -- running --------------------------------------------------------------------------


def _run_by_name(ledger: Ledger, name: str) -> str | None:
    for run in ledger.list_runs():  # newest first
        if run["name"] == name:
            return run["id"]
    return None


def _record(ledger: Ledger, run_id: str, message: dict[str, Any]) -> None:
    ledger.add_event(run_id, EVENT, json.dumps(message))


class _Named:
    """Progress whose task descriptions carry the point's name (``N200k-D100k train``)."""

    def __init__(self, progress: Progress, prefix: str) -> None:
        self.progress, self.prefix = progress, prefix

    def task(self, description: str, total: float | None = None) -> Any:
        return self.progress.task(f"{self.prefix} {description}", total)

    def note(self, line: str) -> None:
        self.progress.note(f"{self.prefix}: {line}")


def run_sweep(
    base: Recipe,
    points: Sequence[PlanPoint],
    workspace: Workspace,
    progress: Progress | None = None,
    sweep_id: str | None = None,
    keep_going: bool = False,
) -> list[str]:
    """Run every point on the same data and tokens versions; returns the run ids.

    Each run is named ``<sweep_id>-<point>`` and gets a ``sweep`` event (JSON: sweep
    id, point, overrides, tuning rule, realized N, versions), written once the run has
    an id, also when it fails. The first run prepares (or reuses) the data and tokens
    versions; every later run must reuse exactly those, or the sweep stops. A run that
    fails (a diverged loss, say) stops the sweep, unless ``keep_going``: then it stays
    in the ledger as a failed run of the sweep and the next point runs.
    """
    from ledgerlm.lab.run import run_recipe  # the runner imports torch; plan() does not

    progress = progress or NullProgress()
    sweep_id = sweep_id or new_sweep_id(base)
    # every run is named <sweep id>-<point>, a recipe name like any other
    if too_long := [p.name for p in points if len(f"{sweep_id}-{p.name}") > NAME_MAX]:
        raise SweepError(
            f"sweep id {shown(sweep_id)}: the name of its run <sweep id>-{too_long[0]} would be "
            f"over {NAME_MAX} characters; shorten the recipe's name"
        )
    if not (SWEEP_ID.fullmatch(sweep_id) and is_name(sweep_id)):
        raise SweepError(
            f"sweep id {shown(sweep_id)}: expected <name>-sweep-<6 hex digits>, a name of "
            f"{NAME_RULE}"
        )
    recipes = [p.recipe(base, f"{sweep_id}-{p.name}") for p in points]
    if not recipes:
        raise SweepError("an empty sweep: plan at least one point")
    inputs = {r.digest("data", "tokenizer") for r in recipes}
    assert len(inputs) == 1, "sweep points must share the data and tokenizer sections"
    with Ledger(workspace.ledger_path) as ledger:
        if any(r["name"].startswith(f"{sweep_id}-") for r in ledger.list_runs()):
            raise SweepError(f"sweep id {sweep_id} is already in the ledger")
    run_ids: list[str] = []
    versions: tuple[str, str] | None = None
    with progress.task("sweep", total=len(points)) as task:
        for index, (point, recipe) in enumerate(zip(points, recipes, strict=True)):
            message: dict[str, Any] = {
                "sweep_id": sweep_id,
                "index": index,
                "of": len(points),
                "point": point.to_dict(),
                "base_recipe_sha256": base.digest(),
            }
            try:
                result = run_recipe(recipe, workspace, _Named(progress, point.name))
            except BaseException as exc:
                with Ledger(workspace.ledger_path) as ledger:
                    if failed := _run_by_name(ledger, recipe.name):
                        _record(ledger, failed, {**message, "failed": repr(exc)})
                        run_ids.append(failed)
                if not keep_going or not isinstance(exc, Exception):
                    raise
                task.advance(1, info=f"{point.name} failed")
                continue
            vocab = int(result.tokens.manifest["tokenizer"]["vocab_size"])
            n = param_count(point.d_model, point.n_layers, vocab, recipe.model.ffn_mult)
            found = (result.data.version, result.tokens.version)
            message.update(N=n, vocab_size=vocab, data_version=found[0], tokens_version=found[1])
            with Ledger(workspace.ledger_path) as ledger:
                _record(ledger, result.run_id, message)
            run_ids.append(result.run_id)
            if versions is None:
                versions = found
            elif found != versions:
                raise SweepError(
                    f"run {result.run_id} used data/tokens {found[0]}/{found[1]}, but the "
                    f"sweep's first run used {versions[0]}/{versions[1]}: one data version "
                    "per sweep"
                )
            task.advance(1, info=point.name)
    return run_ids


# -- reading points back --------------------------------------------------------------


@dataclass
class SweepPoints:
    """Points read back from the ledger; unpacks as ``N, D, loss = sweep_points(...)``.

    N: the run's parameter count as the plan counts it; D: tokens the run consumed
    (the ledger's ``tokens`` counter, padding excluded); loss: the last evaluation's
    validation loss. ``skipped`` lists (run id, reason) for runs with no point.
    ``N_total`` counts every parameter, the token embedding included (it differs from N
    for an untied embedding); ``lr`` is each run's learning rate.
    """

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    runs: list[str]
    sweep_id: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    versions: list[tuple[str | None, str | None]] = field(default_factory=list)
    N_total: np.ndarray | None = None
    lr: np.ndarray | None = None

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def __len__(self) -> int:
        return len(self.runs)

    def distinct(self) -> int:
        """How many distinct (N, D) pairs there are (repeated seeds count once)."""
        return len(set(zip(self.N.tolist(), self.D.tolist(), strict=True)))

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"run": r, "N": int(n), "D": int(d), "loss": float(v)}
            for r, n, d, v in zip(self.runs, self.N, self.D, self.loss, strict=True)
        ]


def _sweep_event(summary: dict[str, Any]) -> dict[str, Any] | None:
    found = None
    for event in summary["events"]:
        if event["kind"] == EVENT:
            found = json.loads(event["message"])
    return found


def _vocab(summary: dict[str, Any], workspace: Workspace | None) -> int:
    run = summary["run"]
    version = run.get("tokens_version")
    if workspace is not None and version and workspace.has_version("tokens", version):
        return int(workspace.manifest("tokens", version)["tokenizer"]["vocab_size"])
    return int(run["recipe"]["tokenizer"]["vocab_size"])


def _embedding(summary: dict[str, Any], workspace: Workspace | None) -> int:
    """The token-embedding parameters N leaves out: none when the embedding is tied to
    the output head (N counts that matrix once, as the head)."""
    model = summary["run"]["recipe"]["model"]
    if model.get("tie_embeddings", True):
        return 0
    return int(model["d_model"]) * _vocab(summary, workspace)


def run_point(
    summary: dict[str, Any], workspace: Workspace | None = None, metric: str = "loss"
) -> tuple[int, int, float] | str:
    """(N, D, final loss) of one run's summary, or why it has none."""
    run = summary["run"]
    if run["status"] not in ("reached", "not reached"):
        return f"status {run['status']}"
    evals = [e for e in summary["evaluations"] if e["metrics"].get(metric) is not None]
    if not evals:
        return f"no {metric} evaluation"
    loss = float(evals[-1]["metrics"][metric])
    tokens = summary["counters"].get("tokens")
    if not tokens:
        return "no tokens counter"
    event = _sweep_event(summary)
    if event is not None and "N" in event:
        n = int(event["N"])
    else:
        model = run["recipe"]["model"]
        n = param_count(
            model["d_model"], model["n_layers"], _vocab(summary, workspace), model["ffn_mult"]
        )
    return n, int(tokens), loss


def find_sweep(ledger: Ledger, ref: str) -> tuple[str, list[str]]:
    """A sweep id (exact, unique prefix, or ``latest``) -> (sweep id, its run ids, in plan
    order)."""
    latest = ref == "latest"
    members: dict[str, list[tuple[int, float, str]]] = {}  # sweep id -> (index, time, run)
    for run in ledger.list_runs():  # newest first, so the first sweep seen is the latest
        if not (latest or run["name"].startswith(ref)):
            continue
        event = _sweep_event(ledger.run_summary(run["id"]))
        if event is not None:
            sid, index = event["sweep_id"], int(event["index"])
        elif named := SWEEP_ID.match(run["name"]):
            # named for a sweep but never given its event (killed, then perhaps resumed)
            sid, index = named.group(1), 1 << 30
        else:
            continue
        if latest or sid.startswith(ref):
            members.setdefault(sid, []).append((index, run["created_at"], run["id"]))
    if not members:
        raise LedgerError(f"no sweep matches {ref!r}")
    found = list(members)
    if latest or len(found) == 1:
        sid = found[0]
    elif ref in members:
        sid = ref
    else:
        raise LedgerError(f"{ref!r} matches {len(found)} sweeps: {', '.join(found[:5])}")
    return sid, [run_id for *_, run_id in sorted(members[sid])]


def sweep_points(
    ledger: Ledger,
    ref: str | Sequence[str],
    workspace: Workspace | None = None,
    metric: str = "loss",
) -> SweepPoints:
    """The (N, D, loss) points of a sweep (id, unique prefix or ``latest``) or of a list
    of runs (ids, prefixes). Runs without a final point (failed, still running) are
    listed in ``skipped``."""
    sweep_id = None
    if isinstance(ref, str):
        sweep_id, run_ids = find_sweep(ledger, ref)
    else:
        run_ids = list(dict.fromkeys(ledger.resolve_run(r) for r in ref))
    n, d, loss, runs, skipped, rules, versions = [], [], [], [], [], [], []
    total, lrs = [], []
    for run_id in run_ids:
        summary = ledger.run_summary(run_id)
        found = run_point(summary, workspace, metric)
        if isinstance(found, str):
            skipped.append((run_id, found))
            continue
        n.append(found[0])
        d.append(found[1])
        loss.append(found[2])
        total.append(found[0] + _embedding(summary, workspace))
        lrs.append(float(summary["run"]["recipe"]["train"]["lr"]))
        runs.append(run_id)
        event = _sweep_event(summary)
        rules.append(event["point"]["rule"] if event else {})
        versions.append((summary["run"]["data_version"], summary["run"]["tokens_version"]))
    return SweepPoints(
        np.asarray(n, dtype=np.float64),
        np.asarray(d, dtype=np.float64),
        np.asarray(loss, dtype=np.float64),
        runs,
        sweep_id,
        skipped,
        rules,
        versions,
        np.asarray(total, dtype=np.float64),
        np.asarray(lrs, dtype=np.float64),
    )
