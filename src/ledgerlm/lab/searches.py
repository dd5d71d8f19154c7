"""The searches a run's recipe was chosen by, on the run's bill.

A recipe names a search it uses: ``data.mixture.from_search`` (a mixture search,
``lab.mixture.use_search``) or ``train.from_tune`` (a tuning study, ``use_tune``: the
best trial's values). ``resolve_searches`` resolves both before the run is created,
and ``charge_search`` records each as a ``search`` phase whose seconds are the
search's wall time and whose detail holds its device time and its bill
(``ledger.search.search_bill`` over its trial runs), so the run's time-to-target, in
wall and device time, includes the cost of the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledgerlm.config import Recipe, apply_overrides, recipe_from_dict
from ledgerlm.ledger.compare import flatten
from ledgerlm.ledger.search import search_bill
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.workspace import Workspace, read_json


def trial_summaries(ledger: Ledger, runs: Sequence[str | None]) -> list[dict[str, Any]]:
    """The summaries of a search's trial runs that the ledger holds (a trial that never
    made a run, or whose run is in another ledger, has none)."""
    found = []
    for run_id in runs:
        if not run_id:
            continue
        try:
            found.append(ledger.run_summary(run_id))
        except LedgerError:
            continue
    return found


def charge(
    kind: str,
    search_id: str,
    trials: Sequence[str],
    summaries: Sequence[dict[str, Any]],
    seconds: float,
    device: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """What a search costs a run: its kind, id, trial runs, wall seconds, device seconds
    and bill (``search_bill`` of its trials' summaries and the search's own time)."""
    bill = search_bill(summaries, seconds=seconds, device=device)
    return {
        "kind": kind,
        "search_id": search_id,
        "trials": list(trials),
        "seconds": bill["total"]["seconds"],
        "device_seconds": bill["total"]["device_seconds"],
        "bill": bill,
        **more,
    }


def mix_charge(ledger: Ledger, record: dict[str, Any]) -> dict[str, Any]:
    """The charge of a mixture search from its record (``mixtures/<id>.json``) and its
    trial runs in the ledger."""
    trials = [t["run"] for t in record.get("trials", [])]
    return charge(
        "mix",
        record["search_id"],
        trials,
        trial_summaries(ledger, trials),
        float(record["seconds"]),
        record.get("device_seconds"),
        objective=record.get("objective"),
    )


def tune_charge(ledger: Ledger, study: dict[str, Any]) -> dict[str, Any]:
    """The charge of a tuning study from its record (``tune/<study>/study.json``) and its
    trial runs in the ledger."""
    trials = [t["run"] for t in study["trials"] if t.get("run")]
    return charge(
        "tune",
        study["study"],
        trials,
        trial_summaries(ledger, trials),
        float(study["seconds"]),
        study.get("device_seconds"),
        objective=study.get("objective"),
        best=study["best"],
    )


def charge_search(ledger: Ledger, run_id: str, search: dict[str, Any]) -> None:
    """A search whose result the run uses (``charge``), as a ``search`` phase holding the
    search's wall time (it ended before the run began) and, in its detail, its kind, id,
    trial runs, device seconds and bill: the run's wall and device time include it."""
    detail = {k: v for k, v in search.items() if k != "seconds"}
    ledger.record_phase(run_id, "search", float(search["seconds"]), detail=detail)


def _tuned_keys(overrides: Sequence[str]) -> list[str]:
    return [item.partition("=")[0].strip() for item in overrides]


def _trial_recipe(ledger: Ledger | None, run_id: str | None) -> dict[str, Any] | None:
    if ledger is None or not run_id:
        return None
    try:
        return ledger.run_summary(run_id)["run"]["recipe"]
    except LedgerError:
        return None


def _shown(v: Any) -> str:
    return "-" if v is None else repr(v)


def _check_base(
    study: dict[str, Any],
    given: dict[str, Any],
    resolved: dict[str, Any],
    tuned: Sequence[str],
    ledger: Ledger | None,
) -> None:
    """Refuse a recipe that is not the study's base recipe (one line naming the keys
    that differ), or that sets a parameter the study tuned to another value than the
    best trial's. ``given`` is the recipe without ``from_tune``; ``resolved`` with the
    best trial's overrides applied. A recipe that differs from the base only in the
    tuned keys, at the best trial's values, is a resolved one (a resume) and passes."""
    sid = study["study"]
    plan = study.get("plan") or {}
    base = plan.get("base_recipe") if isinstance(plan.get("base_recipe"), dict) else None
    named = plan.get("base_recipe") if isinstance(plan.get("base_recipe"), str) else None
    if base is None:  # the best trial's recipe: the base with the tuned keys set, renamed
        base = _trial_recipe(ledger, (study.get("best") or {}).get("run"))
        if base is not None and named is not None:
            base = {**base, "name": named}
    have, best = flatten(given, keep_empty=False), flatten(resolved, keep_empty=False)
    if base is None:
        raise ValueError(
            f"train.from_tune = {sid!r}: this recipe is not the study's base recipe (sha256 "
            f"{plan.get('base_recipe_sha256', '?')[:12]}); run it with the recipe it tuned"
        )
    want = flatten(base, keep_empty=False)
    ignored = {"train.from_tune"} | ({"name"} if base.get("name") is None else set())
    differ = sorted(
        k
        for k in set(have) | set(want)
        if have.get(k) != want.get(k) and k not in ignored and not k.startswith("log.")
    )
    # a tuned key differs from the base (the trial's: at the best value) and from the
    # best value: set to another value than the study's
    clashes = [k for k in tuned if k in differ and have.get(k) != best.get(k)]
    others = [k for k in differ if k not in tuned]
    if others:
        keys = ", ".join(others[:6]) + (f" and {len(others) - 6} more" if len(others) > 6 else "")
        raise ValueError(
            f"train.from_tune = {sid!r}: this recipe is not the study's base recipe: {keys} "
            "differ; run it with the recipe the study tuned (its --set overrides too)"
        )
    if clashes:
        k = clashes[0]
        raise ValueError(
            f"train.from_tune = {sid!r}: {k} = {_shown(have.get(k))}, but the study tuned "
            f"{k} (its best trial: {_shown(best.get(k))}); set from_tune or {k}, not both"
        )


def load_study(workspace: Workspace, ref: str) -> tuple[dict[str, Any], Path]:
    """A study's record and its path (``lab.tune.record``'s format, read here with the
    workspace's helpers: the tune package runs trials through ``lab.resume``, which
    resolves a recipe's searches with this module)."""
    path = workspace.study_file(workspace.resolve_study(ref))
    return read_study(path), path


def read_study(path: Path) -> dict[str, Any]:
    """The study record in ``path``, or one line saying why it is not one."""
    try:
        study = read_json(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a study record ({exc})") from None
    if not isinstance(study, dict) or not isinstance(study.get("trials"), list):
        raise ValueError(f"{path}: not a study record (no list of trials)")
    return study


def use_tune(
    recipe: Recipe, workspace: Workspace, ledger: Ledger | None = None
) -> tuple[Recipe, dict[str, Any] | None]:
    """The recipe with ``train.from_tune`` resolved: the best trial's overrides applied
    and the study's full name in ``from_tune`` (the stored recipe names what was
    trained), and the study's record (None when the recipe names no study). A study
    still under way, one with no ranked trial, a recipe that is not the study's base
    recipe, or one that sets a tuned parameter to another value is refused in one line.
    ``ledger`` holds the trial runs (the best trial's recipe names the keys that differ
    when the study keeps only its base recipe's digest)."""
    ref = recipe.train.from_tune
    if ref is None:
        return recipe, None
    study, path = load_study(workspace, ref)
    sid = study["study"]
    if not study.get("complete"):
        done = sum(1 for t in study["trials"] if t.get("status") != "running")
        planned = (study.get("plan") or {}).get("trials")
        of = f" of {planned}" if planned else ""
        raise ValueError(
            f"{path}: tune study {sid} has no result yet ({done}{of} trials done): run the "
            "same `ledgerlm tune` again to finish it"
        )
    best = study.get("best")
    if not best:
        raise ValueError(
            f"{path}: tune study {sid} has no best trial (none reached a value: every trial "
            "was pruned or failed)"
        )
    overrides = list(best["overrides"])
    given = recipe.to_dict()
    given["train"]["from_tune"] = None
    tree = apply_overrides(given, overrides)
    tree["train"]["from_tune"] = sid
    resolved = recipe_from_dict(tree, "train.from_tune")
    plain = recipe_from_dict(given, "train.from_tune")
    if plain.digest() != (study.get("plan") or {}).get("base_recipe_sha256"):
        done_tree = resolved.to_dict()
        done_tree["train"]["from_tune"] = None
        _check_base(study, given, done_tree, _tuned_keys(overrides), ledger)
    return resolved, study


def resolve_searches(
    recipe: Recipe, workspace: Workspace, ledger: Ledger | None = None
) -> tuple[Recipe, list[dict[str, Any]]]:
    """The recipe with the searches it names resolved (``use_search``, ``use_tune``), and
    what each costs (``charge``; none without a ledger: only the recipe is wanted)."""
    from ledgerlm.lab.mixture import use_search  # the token store imports torch

    recipe, mixture = use_search(recipe, workspace)
    recipe, study = use_tune(recipe, workspace, ledger)
    charges = []
    if ledger is not None:
        if mixture is not None:
            charges.append(mix_charge(ledger, mixture))
        if study is not None:
            charges.append(tune_charge(ledger, study))
    return recipe, charges


def resolved_recipe(recipe: Recipe, workspace: Workspace) -> Recipe:
    """The recipe the ledger stores for a run of ``recipe`` (its searches resolved, as
    ``run_recipe`` resolves them)."""
    if recipe.train.from_tune is None or not workspace.ledger_path.is_file():
        return resolve_searches(recipe, workspace)[0]
    with Ledger(workspace.ledger_path, read_only=True) as ledger:
        return resolve_searches(recipe, workspace, ledger)[0]
