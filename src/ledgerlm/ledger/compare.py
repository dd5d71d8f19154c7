"""Comparing runs (requirement T5): execution speed-ups apart from recipe changes, seeds apart.

Everything here is computed from ``Ledger.run_summary`` dicts, so it works on any ledger
and on hand-built summaries in tests. Three questions are kept separate:

* **execution or recipe?** Against the first run (the baseline), a run that confirmed
  the target at the same step with the same tokens needed the same training; any
  difference in time-to-target is how fast that training (and the phases around it)
  ran. A run that confirmed at another step needed a different amount of training:
  the recipe changed what the target costs, whatever its steps cost.
* **seeds**: runs whose recipes are equal once ``train.seed`` (and the run name, a
  label) is removed are repetitions; they are reported as mean, min-max and sample
  standard deviation, so a one-seed difference can be read against the seed spread.
* **tuning or final?** The validation set is the one targets and comparisons are
  decided on, i.e. the tuning set. A difference found there is not the final figure;
  that is the test-set score of the snapshot that confirmed the target (and of the
  final weights where they differ), recorded when the data holds out a test split
  (``data.test_fraction``); without one the output says the final figure was not
  measured instead of pretending otherwise. Validation and test are set side by side,
  with a warning when the run chosen on validation is not the best on test.

What each run's downstream tasks measured (its final task metrics, the line naming a
task that did not improve when the validation loss did) is ``ledger.compare_tasks``'.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ledgerlm.ledger.compare_tasks import (
    final_metric_values,
    final_metrics,
    task_check,
    task_seconds,
    val_metric,
)
from ledgerlm.ledger.events import TEST_EVALUATION
from ledgerlm.ledger.target import finite, last_in_the_run

RULE = (
    "time-to-target = wall time of all phases up to the evaluation that confirms the "
    "target (the first to complete the contract's number of consecutive evaluations at "
    "or below it). Each run is compared with the first (baseline): 'not comparable' when "
    "either run did not reach the target or their targets (metric, threshold, "
    "confirmation) differ; "
    "'execution' when both confirmed the target at the same step with the same tokens, "
    "so the same training ran faster or slower (step time, prep, eval, checkpoint); "
    "'recipe' when the confirmed steps or tokens differ, so the recipe changed how much "
    "training the target needs. Steps to target are known only at evaluation "
    "granularity (eval every N steps). Runs whose recipes are equal apart from "
    "train.seed (and the run name) form one seed group: mean, min-max, sample std, n, "
    "of the time to target and of each final metric (the validation loss, every task "
    "metric). A run whose validation loss is lower than the baseline's while a task "
    "metric is no better (by its direction: accuracies up, bits per byte down) is named. "
    "All of this is measured on the validation set, which is the tuning set: a recipe "
    "difference found there is not the final figure, which is the test-set score of the "
    "snapshot that confirmed the target, or of the final weights (data.test_fraction > 0)."
)
DEVICE_RULE = (
    "device time = wall x devices held (one per rank), phase by phase, by the resources "
    "each process start recorded; a run recorded before resources counts one device."
)
NO_TEST = "final figure: not measured (no test set evaluation)"
SHARE_KINDS = ("prep", "tokenize", "eval", "checkpoint")
# Metric names that denote a held-out test split, e.g. "test", "test_loss", "test/loss".
_TEST_METRIC = re.compile(r"^test($|[/_.:-])")


def train_step_seconds(summary: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """Mean seconds per optimizer update over the run's closed train phases.

    Seconds and updates come from the same phase rows (``step_end - step_start`` of each
    closed train segment), so an open segment left by a crash counts on neither side.
    A ledger without step bounds on its train phases falls back to the train total over
    the ``optimizer_updates`` counter.
    """
    seconds, updates = 0.0, 0
    for phase in summary.get("phases", []):
        if phase.get("kind") != "train":
            continue
        s, a, b = finite(phase.get("seconds")), phase.get("step_start"), phase.get("step_end")
        if s is None or a is None or b is None:
            continue
        seconds += s
        updates += int(b) - int(a)
    if updates <= 0:
        total = finite(summary.get("phase_totals", {}).get("train"))
        counted = summary.get("counters", {}).get("optimizer_updates")
        if total is None or not counted:
            return None, None
        seconds, updates = total, int(counted)
    return seconds / updates, updates


def recipe_without_seed(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe with ``train.seed`` and the run name removed: what seed groups share."""
    out = {k: v for k, v in recipe.items() if k != "name"}
    if isinstance(out.get("train"), Mapping):
        out["train"] = {k: v for k, v in out["train"].items() if k != "seed"}
    return out


def _seed(recipe: Mapping[str, Any]) -> Any:
    train = recipe.get("train")
    return train.get("seed") if isinstance(train, Mapping) else None


def flatten(tree: Mapping[str, Any], prefix: str = "", keep_empty: bool = True) -> dict[str, Any]:
    """A nested recipe as dotted keys: ``{"train": {"lr": 0.01}}`` -> ``{"train.lr": 0.01}``.

    An empty section (``eval.targets = {}``) is a key of its own with ``{}`` as its
    value, or no key at all with ``keep_empty=False``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}.", keep_empty))
        elif keep_empty or not isinstance(value, Mapping):
            out[f"{prefix}{key}"] = value
    return out


def recipe_diff(base: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for every recipe value that differs (dotted keys, sorted)."""
    a, b = flatten(base, keep_empty=False), flatten(other, keep_empty=False)
    missing = object()
    lines = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, missing), b.get(key, missing)
        if old != new:
            shown = ["-" if v is missing else json.dumps(v) for v in (old, new)]
            lines.append(f"{key}: {shown[0]} -> {shown[1]}")
    return lines


def test_records(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's ``test_evaluation`` records in the order recorded, each with its role:
    the snapshot that confirmed the target (``confirming``) and the final weights
    (``final``) when they differ; a run recorded before roles holds one, ``final``."""
    found = [e for e in summary.get("events", []) if e.get("kind") == TEST_EVALUATION]
    return [{"role": "final", **json.loads(e["message"])} for e in found]


def held_out_metrics(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """Test-split metrics of the run, or ``None`` when none was ever measured.

    Taken from the run's ``test_evaluation`` events (the held-out test split,
    ``data.test_fraction``, scored after training): the confirming snapshot's, else the
    final weights'; else from the confirming evaluation when it carries them, else from
    the last evaluation that does.
    """
    records = test_records(summary)  # the runner's test scores
    if records:
        found = next((r for r in records if r["role"] == "confirming"), records[-1])
        return {k: found[k] for k in ("step", "snapshot", "metrics")}
    evals = list(summary.get("evaluations", []))
    confirming = (summary.get("time_to_target") or {}).get("evaluation")
    candidates = ([confirming] if confirming else []) + evals[::-1]
    for ev in candidates:
        found = {k: v for k, v in (ev.get("metrics") or {}).items() if _TEST_METRIC.match(k)}
        if found:
            return {"step": ev.get("step"), "snapshot": ev.get("snapshot"), "metrics": found}
    return None


def run_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """What one run cost to reach its target, and where its wall time went."""
    run = summary["run"]
    ttt = summary["time_to_target"]
    confirming = ttt.get("evaluation") or {}
    total = float(summary.get("total_seconds") or 0.0)
    totals = summary.get("phase_totals", {})
    step_s, step_updates = train_step_seconds(summary)
    kinds = dict.fromkeys([*SHARE_KINDS, *totals])
    shares = {k: float(totals.get(k) or 0.0) / total if total > 0 else None for k in kinds}
    return {
        "id": run["id"],
        "name": run.get("name"),
        "status": run.get("status"),
        "seed": _seed(run.get("recipe") or {}),
        "target": {
            "metric": run.get("target_metric"),
            "threshold": run.get("target_value"),
            "confirm": int(((run.get("meta") or {}).get("contract") or {}).get("confirm", 1)),
            "targets": ((run.get("meta") or {}).get("contract") or {}).get("targets") or {},
        },
        "eval_every": run.get("eval_every"),
        "reached": bool(ttt["reached"]),
        "time_to_target": ttt["seconds"] if ttt["reached"] else None,
        "steps_to_target": ttt["step"] if ttt["reached"] else None,
        "tokens_to_target": confirming.get("tokens") if ttt["reached"] else None,
        "targets_to_target": confirming.get("targets") if ttt["reached"] else None,
        "updates_to_target": confirming.get("updates") if ttt["reached"] else None,
        "confirming_value": (confirming.get("metrics") or {}).get(ttt["metric"])
        if ttt["reached"]
        else None,
        "to_target_by_phase": dict(ttt.get("by_phase") or {}),
        "device_seconds_to_target": finite(ttt.get("device_seconds")) if ttt["reached"] else None,
        "device_hours_to_target": finite(ttt.get("device_hours")) if ttt["reached"] else None,
        "cost_to_target": ttt.get("cost") if ttt["reached"] else None,
        "device_seconds": finite(summary.get("device_seconds")),
        "resources": summary.get("resources"),
        "total_seconds": total,
        "train_step_seconds": step_s,
        "train_step_updates": step_updates,
        "phase_seconds": {k: float(v or 0.0) for k, v in totals.items()},
        "shares": shares,
        "test": held_out_metrics(summary),
        "tests": test_records(summary),
        "final_domains": final_domain_losses(summary),
        "final_value": final_value(summary),
        "val_metric": val_metric(summary),
        "final_metrics": final_metrics(summary),
        "task_seconds": sum(task_seconds(summary).values()),
        "task_seconds_to_target": finite(ttt.get("task_seconds")) if ttt["reached"] else None,
    }


def final_value(summary: Mapping[str, Any]) -> float | None:
    """The target metric at the run's own last evaluation: how far a run that did not
    reach its target got."""
    last = last_in_the_run(summary)
    if last is None:
        return None
    return finite(last["metrics"].get(summary["run"].get("target_metric")))


def final_domain_losses(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """Each domain's validation loss at the run's own last evaluation (``loss/<domain>``)."""
    found = last_in_the_run(summary)
    if found is None:
        return {}
    last = found["metrics"]
    return {k.split("/", 1)[1]: finite(v) for k, v in sorted(last.items()) if k.startswith("loss/")}


def domain_deltas(base: Mapping[str, Any], other: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per domain of either run: the final validation loss of the baseline and of the
    other run, and the change (negative: the other run is better on that domain)."""
    a, b = base["final_domains"], other["final_domains"]
    rows = []
    for d in sorted(set(a) | set(b)):
        x, y = a.get(d), b.get(d)
        delta = y - x if x is not None and y is not None else None
        rows.append({"domain": d, "baseline": x, "run": y, "delta": delta})
    return rows


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Mean, min, max, sample standard deviation (``None`` below two values) and n."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "mean": None, "min": None, "max": None, "std": None}
    return {
        "n": len(vals),
        "mean": statistics.fmean(vals),
        "min": min(vals),
        "max": max(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
    }


def seed_groups(
    summaries: Sequence[Mapping[str, Any]], figures: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Runs grouped by recipe-without-seed, in order of first appearance."""
    groups: dict[str, dict[str, Any]] = {}
    for summary, fig in zip(summaries, figures, strict=True):
        key = json.dumps(recipe_without_seed(summary["run"].get("recipe") or {}), sort_keys=True)
        g = groups.setdefault(key, {"runs": [], "seeds": [], "figures": []})
        g["runs"].append(fig["id"])
        g["seeds"].append(fig["seed"])
        g["figures"].append(fig)
    out = []
    for index, g in enumerate(groups.values()):
        figs = g.pop("figures")
        reached = [f for f in figs if f["reached"]]
        g.update(
            group=index,
            n=len(figs),
            n_reached=len(reached),
            distinct_seeds=len({json.dumps(s) for s in g["seeds"]}),
            time_to_target=spread([f["time_to_target"] for f in reached]),
            steps_to_target=spread([f["steps_to_target"] for f in reached]),
            tokens_to_target=spread(
                [f["tokens_to_target"] for f in reached if f["tokens_to_target"] is not None]
            ),
            train_step_seconds=spread(
                [f["train_step_seconds"] for f in figs if f["train_step_seconds"] is not None]
            ),
            final_metrics=[
                {"metric": key, **spread(values)}
                for key, values in final_metric_values(figs).items()
            ],
        )
        out.append(g)
    return out


def wall_against_device(run: str, wall_ratio: float, device_ratio: float) -> str | None:
    """One line when a run is sooner in wall time but dearer in device time than the
    baseline (or later but cheaper); ``None`` when both move the same way."""
    if wall_ratio < 1 < device_ratio:
        return (
            f"{run} reaches the target {(1 - wall_ratio) * 100:.0f}% sooner in wall time "
            f"but costs {(device_ratio - 1) * 100:.0f}% more device time"
        )
    if device_ratio < 1 < wall_ratio:
        return (
            f"{run} reaches the target {(wall_ratio - 1) * 100:.0f}% later in wall time "
            f"but costs {(1 - device_ratio) * 100:.0f}% less device time"
        )
    return None


def _device_delta(base: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    a, b = base["device_seconds_to_target"], other["device_seconds_to_target"]
    if a is None or b is None:
        return {"device_seconds_delta": None, "device_seconds_ratio": None, "wall_device": None}
    ratio = b / a if a else None
    wall = other["time_to_target"] / base["time_to_target"] if base["time_to_target"] else None
    line = None if ratio is None or wall is None else wall_against_device(other["id"], wall, ratio)
    return {"device_seconds_delta": b - a, "device_seconds_ratio": ratio, "wall_device": line}


def _pct(new: float, old: float) -> float | None:
    return (new - old) / old * 100 if old else None


def classify(
    base: Mapping[str, Any],
    other: Mapping[str, Any],
    base_summary: Mapping[str, Any],
    other_summary: Mapping[str, Any],
) -> dict[str, Any]:
    """One run against the baseline under ``RULE``."""
    diff = recipe_diff(
        base_summary["run"].get("recipe") or {}, other_summary["run"].get("recipe") or {}
    )
    out: dict[str, Any] = {
        "run": other["id"],
        "baseline": base["id"],
        "recipe_diff": diff,
        "seed_only": bool(diff) and all(line.startswith(("train.seed:", "name:")) for line in diff),
    }
    out["final"] = _final_figure(base, other)
    if base["target"] != other["target"]:
        return {**out, "class": "not comparable", "reason": "different targets"}
    missing = [f["id"] for f in (base, other) if not f["reached"]]
    if missing:
        return {
            **out,
            "class": "not comparable",
            "reason": "target not reached by " + ", ".join(missing),
        }
    dt = other["time_to_target"] - base["time_to_target"]
    out.update(
        seconds_delta=dt,
        seconds_ratio=other["time_to_target"] / base["time_to_target"]
        if base["time_to_target"]
        else None,
        steps_delta=other["steps_to_target"] - base["steps_to_target"],
        by_phase_delta={
            k: other["to_target_by_phase"].get(k, 0.0) - base["to_target_by_phase"].get(k, 0.0)
            for k in dict.fromkeys([*base["to_target_by_phase"], *other["to_target_by_phase"]])
        },
        **_device_delta(base, other),
    )
    same_steps = other["steps_to_target"] == base["steps_to_target"]
    same_tokens = other["tokens_to_target"] == base["tokens_to_target"]
    if same_steps and same_tokens:
        if dt < 0:
            reason = "same steps to target, faster"
        elif dt > 0:
            reason = "same steps to target, slower"
        else:
            reason = "same steps to target, same time"
        bs, os_ = base["train_step_seconds"], other["train_step_seconds"]
        if bs and os_:
            out["step_seconds_ratio"] = os_ / bs
            reason += f" (train step time x{os_ / bs:.2f})"
        return {**out, "class": "execution", "reason": reason}
    if same_steps:
        reason = "same confirmed step but different tokens to target"
    else:
        fewer = "fewer" if other["steps_to_target"] < base["steps_to_target"] else "more"
        reason = (
            f"{fewer} steps to target ({other['steps_to_target']} vs {base['steps_to_target']})"
        )
    if out["seed_only"]:
        reason += "; the recipes differ only by train.seed, so this is seed variation"
    return {**out, "class": "recipe", "reason": reason}


def _final_figure(base: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    if base["test"] is None or other["test"] is None:
        return NO_TEST
    names = sorted(set(base["test"]["metrics"]) & set(other["test"]["metrics"]))
    if not names:
        return NO_TEST
    name = "test/loss" if "test/loss" in names else names[0]
    a, b = base["test"]["metrics"][name], other["test"]["metrics"][name]
    if finite(a) is None or finite(b) is None:
        return NO_TEST
    return f"final figure: {name} {b:.4f} vs {a:.4f} (baseline), delta {b - a:+.4f}"


def _test_value(record: Mapping[str, Any] | None, key: str) -> float | None:
    return None if record is None else finite((record.get("metrics") or {}).get(key))


def validation_and_test(figures: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each run's validation figure (at its confirming evaluation, else its last) beside
    its test figures on the same metric (``test/<metric>`` of the baseline's target):
    the confirming snapshot's and the final weights' (the same when the run stopped on
    the snapshot). ``warning`` is one line when the run chosen on validation (the
    soonest to target; with none reached, the best last validation figure) is not the
    best on test (its test figure: the confirming snapshot's, else the final weights')."""
    metric = figures[0]["target"]["metric"]
    key = f"test/{metric}"
    rows = []
    for f in figures:
        by_role = {t["role"]: t for t in f["tests"]}
        confirming = _test_value(by_role.get("confirming"), key)
        final = _test_value(by_role.get("final") or by_role.get("confirming"), key)
        rows.append(
            {
                "run": f["id"],
                "reached": f["reached"],
                "validation": f["confirming_value"] if f["reached"] else f["final_value"],
                "test_confirming": confirming,
                "test_final": final,
                "test": confirming if confirming is not None else final,
            }
        )
    out = {"metric": metric, "test_metric": key, "rows": rows, "chosen": None, "warning": None}
    if any(f["target"]["metric"] != metric for f in figures):
        return out  # validation figures on different metrics rank nothing
    reached = [(f["time_to_target"], r) for f, r in zip(figures, rows, strict=True) if f["reached"]]
    scored = [(r["validation"], r) for r in rows if r["validation"] is not None]
    how, pool = ("soonest to target", reached) if reached else ("best validation", scored)
    if not pool:
        return out
    chosen = min(pool, key=lambda x: x[0])[1]
    tested = [r for r in rows if r["test"] is not None]
    out["chosen"] = chosen["run"]
    if chosen["test"] is None or not tested:
        return out
    best = min(tested, key=lambda r: r["test"])
    out["best_on_test"] = best["run"]
    if best["test"] < chosen["test"]:
        out["warning"] = (
            f"{chosen['run']}, chosen on validation ({how}), is not the best on test: "
            f"{best['run']} has {key} {best['test']:.4f} against {chosen['test']:.4f}"
        )
    return out


def compare_runs(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Compare runs, the first being the baseline; a JSON-able dict (see ``RULE``)."""
    if not summaries:
        raise ValueError("compare needs at least one run")
    figures = [run_figures(s) for s in summaries]
    base = figures[0]
    comparisons = [
        {
            **classify(base, fig, summaries[0], summary),
            "domains": domain_deltas(base, fig),
            "task_check": task_check(base, fig),
        }
        for fig, summary in zip(figures[1:], summaries[1:], strict=True)
    ]
    measured = [f for f in figures if f["test"] is not None]
    if not measured:
        final = NO_TEST
    else:
        final = (
            f"final figure: test metrics measured for {len(measured)} of {len(figures)} runs "
            "(see each run's test field)"
        )
    return {
        "rule": RULE,
        "device_rule": DEVICE_RULE,
        # whether any run recorded its resources: the device-time columns are shown then
        "resources_recorded": any(f["resources"] for f in figures),
        "baseline": base["id"],
        "final_figure": final,
        "validation_is_tuning_set": True,
        "held_out": validation_and_test(figures),
        "runs": figures,
        "comparisons": comparisons,
        "seed_groups": seed_groups(summaries, figures),
    }


# The comparison table's columns, as ``ledger compare`` and the run report head it.
TABLE_COLUMNS = (
    "run", "seed", "time to target", "step", "tokens", "updates", "s/step", *SHARE_KINDS,
    "vs baseline",
)  # fmt: skip


def _count(value: Any, fmt: str = ",") -> str:
    return "-" if value is None else format(value, fmt)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def comparison_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of the comparison table of a ``compare_runs`` result, the baseline first.

    Each row holds the run's id and seed (as text), whether it reached the target, its
    time to target, device-hours to target and final value (each renderer words those
    its own way), ``cells``:
    the text of the columns from ``step`` to ``checkpoint`` (``-`` where unknown), its
    verdict against the baseline (``"baseline"`` for the baseline) and ``comparison``,
    that run's entry of ``result["comparisons"]`` (``None`` for the baseline)."""
    verdicts = {c["run"]: c for c in result["comparisons"]}
    rows = []
    for f in result["runs"]:
        c = verdicts.get(f["id"])
        rows.append(
            {
                "run": f["id"],
                "seed": str(f["seed"]),
                "reached": f["reached"],
                "time_to_target": f["time_to_target"],
                "device_hours": f.get("device_hours_to_target"),
                "final_value": f.get("final_value"),
                "cells": [
                    _count(f["steps_to_target"]),
                    _count(f["tokens_to_target"]),
                    _count(f["updates_to_target"]),
                    _count(f["train_step_seconds"], ".4f"),
                    *(_share(f["shares"].get(k)) for k in SHARE_KINDS),
                ],
                "verdict": "baseline" if c is None else c["class"],
                "comparison": c,
            }
        )
    return rows


def seed_spread(group: Mapping[str, Any]) -> str:
    """A seed group's time to target in words: mean, min-max, sample std and n."""
    s = group["time_to_target"]
    if s["n"] == 0:
        return "none reached the target"
    return (
        f"time to target mean {s['mean']:,.1f} s, min-max {s['min']:,.1f}-"
        f"{s['max']:,.1f} s, std {_count(s['std'], ',.1f')} s (n={s['n']})"
    )
