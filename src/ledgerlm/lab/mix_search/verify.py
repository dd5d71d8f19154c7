"""The verification of a mixture at the target scale: the recipe's own mixture (the
baseline) and the found one (a file of weights or a search's result) on the same budget,
compared per domain (``verify_mixture``, ``read_mixture``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from ledgerlm.config import Recipe, apply_overrides, recipe_from_dict
from ledgerlm.ledger.target import last_in_the_run
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.train.distributed import one_process
from ledgerlm.workspace import Workspace


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
    finals = {k: last_in_the_run(r.summary)["metrics"] for k, r in results.items()}
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
