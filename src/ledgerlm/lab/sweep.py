"""Running a scaling sweep and reading its points back (requirement S1).

The plan (shape, token and tuning rules, what N counts) is ``ledgerlm.scaling.sweep``;
this module joins it to the runner and the ledger.

**Running.** ``run_sweep`` runs every planned point, one after another, on one data
version: the first run prepares (or reuses) the data and tokens versions, every later
run must reuse exactly those. Each run is named ``<sweep id>-<point>`` and gets a
``sweep`` event (JSON: sweep id, index, point, overrides, tuning rule, realized N,
versions), also when it fails. The plan is kept in ``sweeps/<sweep id>.json`` before the
first point runs, with the sweep's runs, wall and device time and bill (``ledger.search``)
brought up to date as each ends, and every point is continued (``lab.resume.continue_run``),
so running the same sweep again reuses the points that finished and resumes the one that
was killed. The runner (and so torch) is imported only when a sweep runs; reading points
back needs neither.

**Reading back.** ``sweep_points`` gives the (N, D, loss) points of a sweep (``find_sweep``:
an id, a unique prefix or ``latest``) or of a list of runs: N as the run's ``sweep`` event
recorded it (else counted from its recipe and trained vocabulary), D the tokens the run
consumed (the ledger's ``tokens`` counter, padding excluded), loss its last evaluation.
Runs with no final point (failed, still running) are listed as skipped, and a sweep's
planned points without a result as missing (``missing_line``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ledgerlm.config import NAME_MAX, NAME_RULE, Recipe, is_name, shown
from ledgerlm.lab.searches import trial_summaries
from ledgerlm.lab.status import with_liveness
from ledgerlm.ledger.events import SWEEP, latest_json
from ledgerlm.ledger.search import search_bill
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.progress import Named, NullProgress, Progress
from ledgerlm.scaling.sweep import (
    SWEEP_ID,
    PlanPoint,
    SweepError,
    plan_digest,
)
from ledgerlm.scaling.sweep import sweep_id as plan_sweep_id
from ledgerlm.shape import param_count
from ledgerlm.workspace import Workspace, atomic_write_json, read_json

# -- running --------------------------------------------------------------------------


def _run_by_name(ledger: Ledger, name: str) -> str | None:
    for run in ledger.list_runs():  # newest first
        if run["name"] == name:
            return run["id"]
    return None


def _record(ledger: Ledger, run_id: str, message: dict[str, Any]) -> None:
    ledger.add_event(run_id, SWEEP, json.dumps(message))


def record_plan(
    workspace: Workspace, sweep_id: str, base: Recipe, points: Sequence[PlanPoint]
) -> dict[str, Any]:
    """The sweep's plan, kept in ``sweeps/<sweep id>.json`` before its first point runs
    (every point with the name of its run); a plan already kept under that id must be
    this one, else the sweep is refused."""
    path = workspace.sweep_file(sweep_id)
    digest = plan_digest(base, points)
    if path.is_file():
        found = read_plan(workspace, sweep_id)
        if found is None or found.get("plan_sha256") != digest:
            raise SweepError(
                f"{path}: sweep {sweep_id} was planned from another recipe or grid; run it "
                "with the same recipe and flags, or give this one another --name"
            )
        return found
    plan = {
        "sweep_id": sweep_id,
        "plan_sha256": digest,
        "base_recipe": base.name,
        "base_recipe_sha256": base.digest(),
        "created_at": time.time(),
        "points": [{**p.to_dict(), "run_name": f"{sweep_id}-{p.name}"} for p in points],
    }
    atomic_write_json(path, plan)
    return plan


def stamp_bill(workspace: Workspace, plan: dict[str, Any], run_ids: Sequence[str]) -> None:
    """The sweep's runs, wall time, device time and bill (``ledger.search.search_bill`` of
    its points' runs: a sweep's time is its runs'), kept in its plan file."""
    with Ledger(workspace.ledger_path, read_only=True) as ledger:
        bill = search_bill(trial_summaries(ledger, run_ids))
    plan.update(
        trials=list(run_ids),
        seconds=bill["total"]["seconds"],
        device_seconds=bill["total"]["device_seconds"],
        bill=bill,
    )
    atomic_write_json(workspace.sweep_file(plan["sweep_id"]), plan)


def read_plan(workspace: Workspace, sweep_id: str) -> dict[str, Any] | None:
    """A sweep's kept plan, or None when it has none (a sweep of older code)."""
    path = workspace.sweep_file(sweep_id)
    if not path.is_file():
        return None
    try:
        plan = read_json(path)
    except (OSError, ValueError) as exc:
        raise SweepError(f"{path}: not a sweep plan ({exc})") from None
    if not (isinstance(plan, dict) and isinstance(plan.get("points"), list)):
        raise SweepError(f"{path}: not a sweep plan (no list of points)")
    return plan


def sweep_id_of(base: Recipe, points: Sequence[PlanPoint], name: str | None = None) -> str:
    """The sweep's id: ``name`` when given, else the plan's own (``scaling.sweep.sweep_id``:
    the same plan, the same id); refused when it is no name or its runs' names would be."""
    found = name or plan_sweep_id(base, points)
    _check_id(found, points)
    return found


def _check_id(sweep_id: str, points: Sequence[PlanPoint]) -> None:
    # every run is named <sweep id>-<point>, a recipe name like any other
    if too_long := [p.name for p in points if len(f"{sweep_id}-{p.name}") > NAME_MAX]:
        raise SweepError(
            f"sweep id {shown(sweep_id)}: the name of its run <sweep id>-{too_long[0]} would be "
            f"over {NAME_MAX} characters; shorten the recipe's name (or --name)"
        )
    if not is_name(sweep_id):
        raise SweepError(f"sweep id {shown(sweep_id)}: expected a name of {NAME_RULE}")


def run_sweep(
    base: Recipe,
    points: Sequence[PlanPoint],
    workspace: Workspace,
    progress: Progress | None = None,
    sweep_id: str | None = None,
    keep_going: bool = False,
) -> list[str]:
    """Run every point on the same data and tokens versions; returns the run ids.

    The sweep id is ``sweep_id`` (``--name``) or the plan's own (``scaling.sweep.sweep_id``),
    and the plan is kept (``record_plan``) before the first point runs. Each run is named
    ``<sweep_id>-<point>`` and continued (``lab.resume.continue_run``): a point that
    finished is reused, one that was interrupted or failed is resumed from its checkpoint
    (restarted from step 0 in the same ledger run when it had none), so running the same
    sweep again continues it and trains nothing twice. Each run gets a ``sweep`` event
    (JSON: sweep id, point, overrides, tuning rule, realized N, versions) once it ends,
    also when it fails. The first run prepares (or reuses) the data and tokens versions;
    every later run must reuse exactly those, or the sweep stops. A run that fails (a
    diverged loss, say) stops the sweep, unless ``keep_going``: then it stays in the
    ledger as a failed run of the sweep and the next point runs.
    """
    # the runner imports torch; plan() does not
    from ledgerlm.lab.resume import PlanConflict, continue_run
    from ledgerlm.train.distributed import one_process

    one_process()  # under torchrun every rank would run the whole sweep
    progress = progress or NullProgress()
    if not points:
        raise SweepError("an empty sweep: plan at least one point")
    sweep_id = sweep_id_of(base, points, sweep_id)
    recipes = [p.recipe(base, f"{sweep_id}-{p.name}") for p in points]
    inputs = {r.digest("data", "tokenizer") for r in recipes}
    assert len(inputs) == 1, "sweep points must share the data and tokenizer sections"
    kept = record_plan(workspace, sweep_id, base, points)
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
            named = Named(progress, point.name)
            try:
                run = continue_run(recipe, workspace, named)
            except PlanConflict:
                raise  # not this sweep's failure: nothing is recorded on that run
            except BaseException as exc:
                with Ledger(workspace.ledger_path) as ledger:
                    if failed := _run_by_name(ledger, recipe.name):
                        _record(ledger, failed, {**message, "failed": repr(exc)})
                        run_ids.append(failed)
                if failed:  # on the sweep's bill too
                    stamp_bill(workspace, kept, run_ids)
                if not keep_going or not isinstance(exc, Exception):
                    raise
                task.advance(1, info=f"{point.name} failed")
                continue
            if run.how != "started":
                named.note(f"{run.how} run {run.run_id}")
            vocab = int(run.tokens.manifest["tokenizer"]["vocab_size"])
            n = param_count(point.d_model, point.n_layers, vocab, recipe.model.ffn_mult)
            found = (run.data.version, run.tokens.version)
            message.update(N=n, vocab_size=vocab, data_version=found[0], tokens_version=found[1])
            if run.how != "reused" or "N" not in (_sweep_event(run.summary) or {}):
                with Ledger(workspace.ledger_path) as ledger:
                    _record(ledger, run.run_id, message)
            run_ids.append(run.run_id)
            stamp_bill(workspace, kept, run_ids)
            if versions is None:
                versions = found
            elif found != versions:
                raise SweepError(
                    f"run {run.run_id} used data/tokens {found[0]}/{found[1]}, but the "
                    f"sweep's first run used {versions[0]}/{versions[1]}: one data version "
                    "per sweep"
                )
            task.advance(1, info=f"{point.name} {run.how}" if run.how != "started" else point.name)
    return run_ids


# -- reading points back --------------------------------------------------------------


@dataclass
class SweepPoints:
    """Points read back from the ledger; unpacks as ``N, D, loss = sweep_points(...)``.

    N: the run's parameter count as the plan counts it; D: tokens the run consumed
    (the ledger's ``tokens`` counter, padding excluded); loss: the last evaluation's
    validation loss. ``skipped`` lists (run id, reason) for runs with no point. For a
    sweep with a kept plan, ``planned`` counts its points and ``missing`` lists those with
    no result (point, N, D, the run of its name or None, why).
    ``N_total`` counts every parameter, the token embedding included (it differs from N
    for an untied embedding); ``lr`` is each run's learning rate. ``bill``: what the runs
    cost (``ledger.search.search_bill``: by how each ended, wall and device time).
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
    planned: int | None = None
    missing: list[dict[str, Any]] = field(default_factory=list)
    bill: dict[str, Any] | None = None

    def missing_line(self) -> str | None:
        """What ``missing_line`` says of this sweep's planned points without a result."""
        if not (self.missing and self.sweep_id and self.planned):
            return None
        return missing_line(self.sweep_id, self.planned, self.missing)

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
    return latest_json(summary, SWEEP)


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


def _plans(workspace: Workspace | None, ref: str) -> list[dict[str, Any]]:
    """The kept plans whose sweep id starts with ``ref`` (every plan for ``latest``)."""
    folder = workspace.root / "sweeps" if workspace is not None else None
    if folder is None or not folder.is_dir():
        return []
    ids = sorted(p.name[: -len(".json")] for p in folder.glob("*.json"))
    assert workspace is not None
    found = [read_plan(workspace, i) for i in ids if ref == "latest" or i.startswith(ref)]
    return [p for p in found if p is not None]


def find_sweep(
    ledger: Ledger, ref: str, workspace: Workspace | None = None
) -> tuple[str, list[str]]:
    """A sweep id (exact, unique prefix, or ``latest``) -> (sweep id, its run ids, in plan
    order). With a workspace, kept plans count too: a planned point's run is the run of
    its name, and a sweep none of whose points has started yet is found."""
    latest = ref == "latest"
    members: dict[str, dict[str, tuple[int, float]]] = {}  # sweep -> run -> (index, time)
    when: dict[str, float] = {}  # sweep id -> its newest run or plan
    runs = ledger.list_runs()  # newest first
    for run in runs:
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
            members.setdefault(sid, {})[run["id"]] = (index, run["created_at"])
            when[sid] = max(when.get(sid, 0.0), run["created_at"])
    for plan in _plans(workspace, ref):
        sid = plan["sweep_id"]
        index = {p["run_name"]: i for i, p in enumerate(plan["points"])}
        group = members.setdefault(sid, {})
        for run in runs:
            if run["name"] in index:  # the plan says which point it is
                group[run["id"]] = (index[run["name"]], run["created_at"])
        when[sid] = max(when.get(sid, 0.0), float(plan.get("created_at", 0.0)))
    if not members:
        raise LedgerError(f"no sweep matches {ref!r}")
    found = list(members)
    if latest:
        sid = max(found, key=lambda k: when[k])
    elif len(found) == 1:
        sid = found[0]
    elif ref in members:
        sid = ref
    else:
        raise LedgerError(f"{ref!r} matches {len(found)} sweeps: {', '.join(found[:5])}")
    order = sorted(members[sid].items(), key=lambda item: item[1])
    return sid, [run_id for run_id, _ in order]


def _e(x: float) -> str:
    """2 significant digits, exponents without padding: 1.3e5, 4e4."""
    mantissa, e, exp = f"{x:.2g}".partition("e")
    return f"{mantissa}e{int(exp)}" if e else mantissa


def missing_line(sweep_id: str, planned: int, missing: list[dict[str, Any]]) -> str:
    """``sweep X: 1 of 6 planned points has no result: N=1.3e5 D=4e4 (run R: interrupted)``."""
    has = "has" if len(missing) == 1 else "have"
    shown_ = [
        f"N={_e(m['N'])} D={_e(m['D'])} ("
        + (f"run {m['run']}: {m['why']}" if m["run"] else m["why"])
        + ")"
        for m in missing[:5]
    ]
    more = f"; and {len(missing) - 5} more" if len(missing) > 5 else ""
    return (
        f"sweep {sweep_id}: {len(missing)} of {planned} planned points {has} no result: "
        + "; ".join(shown_)
        + more
    )


def _missing(
    plan: dict[str, Any], names: dict[str, str], skipped: dict[str, str]
) -> list[dict[str, Any]]:
    """The planned points without a result: each with the run of its name (the latest,
    when there are several) and why it has none (``not run`` when there is no run)."""
    runs: dict[str, list[str]] = {}
    for run_id, name in names.items():
        runs.setdefault(name, []).append(run_id)
    out = []
    for p in plan["points"]:
        mine = runs.get(p["run_name"], [])
        if any(r not in skipped for r in mine):
            continue
        run = mine[-1] if mine else None
        why = skipped[run].removeprefix("status ") if run else "not run"
        out.append({"point": p["name"], "N": p["N"], "D": p["D"], "run": run, "why": why})
    return out


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
        sweep_id, run_ids = find_sweep(ledger, ref, workspace)
    else:
        run_ids = list(dict.fromkeys(ledger.resolve_run(r) for r in ref))
    n, d, loss, runs, skipped, rules, versions = [], [], [], [], [], [], []
    total, lrs = [], []
    names: dict[str, str] = {}
    summaries = []
    for run_id in run_ids:
        summary = ledger.run_summary(run_id)
        names[run_id] = summary["run"]["name"]
        if workspace is not None:  # a running run whose process died is interrupted
            summary["run"] = with_liveness(workspace, [summary["run"]])[0]
        summaries.append(summary)
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
    plan = read_plan(workspace, sweep_id) if workspace is not None and sweep_id else None
    planned = len(plan["points"]) if plan is not None else None
    missing = _missing(plan, names, dict(skipped)) if plan is not None else []
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
        planned,
        missing,
        search_bill(summaries),
    )


def run_sweep_points(
    base: Recipe,
    points: Sequence[PlanPoint],
    workspace: Workspace,
    progress: Progress | None = None,
    sweep_id: str | None = None,
    keep_going: bool = False,
) -> SweepPoints:
    """``run_sweep``, then the sweep's points read back from the workspace's ledger
    (``sweep_points``), as ``scale run`` reports them."""
    sweep_id = sweep_id_of(base, points, sweep_id)
    run_sweep(base, points, workspace, progress, sweep_id=sweep_id, keep_going=keep_going)
    with Ledger(workspace.ledger_path) as ledger:
        return sweep_points(ledger, sweep_id, workspace)
