"""``ledgerlm tune`` benchmarks: what pruning saves, what the study itself costs per
trial, and what two local workers give on this machine. Every side is a whole command
(``python -m ledgerlm ...``, a fresh process, the way a user waits for it), its figures
read back from the study's record (``tune/<study>/study.json``) and the ledger.

- **pruning** (the demo recipe on the built-in corpus): 16 TPE trials over
  ``train.lr``, ``train.warmup_steps`` and ``pack.seq_len`` (context), ASHA against no
  pruning with the same sampler seed. Per study: the best time-to-target found (the
  objective ``time``: device-seconds), its device-hours (every trial's run), the trials
  by status, the wall time. Then the share of device time ASHA saved (goal: at least
  40%) and whether its best is within 5% of the unpruned study's. Last, the best trial
  of the ASHA study trained with ``ledgerlm run --from-tune``: its time-to-target with
  the study's ``search`` phase on its bill and without it.
- **overhead**: grid studies of N and 2N trials that differ only in ``train.seed``
  (the tiny recipe, 40 updates), one after another in the command's process. What the
  larger study spends outside its trial runs beyond what the smaller one does, per
  extra trial, is the study's cost of one more trial (Optuna's storage, the record,
  opening the ledger, the checks before each run), as a share of the median trial
  (goal: under 3%); the rest is paid once per command (opening the study, the first
  model the process builds), and the command's start-up is reported apart. Baseline
  in the same run: the same recipe as a plain ``ledgerlm run``, its wall beside the
  trials'.
- **workers**: the same grid study of 4 trials with ``--workers 1`` and ``--workers 2``
  (and ``--executor ray --workers 2`` with ``--ray``): wall and device time. On a
  2-core machine two workers of one core each are expected to gain no wall time: the
  cores are the same.

A warm-up run in each workspace prepares the data and tokens first, so no trial pays
for them. The machine's load (``os.getloadavg``) and other processes' share of the CPU
are printed beside each section: figures taken while others use the CPU are only as
good as that share is small.

    python bench/tune_study.py --quick                  # every section small: minutes
    python bench/tune_study.py                          # the full figures: hours on 2 cores
    python bench/tune_study.py --only pruning --json    # one section, as JSON
    python bench/tune_study.py --recipe configs/tiny.toml   # pruning on the tiny recipe
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from commands import ROOT, ledgerlm, sets
from machine_load import load, measured

SECTIONS = ("pruning", "overhead", "workers")
GOAL_SAVED, GOAL_BEST, GOAL_OVERHEAD = 0.40, 0.05, 0.03


def settings(quick: bool) -> dict[str, Any]:
    """What each section runs; ``quick`` checks the script works in a few minutes."""
    if quick:
        return {
            "pruning": {
                "recipe": ROOT / "configs" / "tiny.toml",
                "params": [
                    "train.lr=log:1e-3:1e-2",
                    "train.warmup_steps=int:0:20",
                    "pack.seq_len=choice:32,64",
                ],
                "trials": 4,
                "sets": ["train.max_steps=60", "eval.every_steps=10", "eval.target_loss=5.3"],
            },
            "overhead": {"trials": 3, "sets": ["train.max_steps=40", "eval.every_steps=10"]},
            "workers": {"trials": 2, "sets": ["train.max_steps=40", "eval.every_steps=10"]},
        }
    return {
        "pruning": {
            "recipe": ROOT / "configs" / "demo.toml",
            "params": [
                "train.lr=log:1e-4:3e-2",
                "train.warmup_steps=int:0:100",
                "pack.seq_len=choice:64,128,256",
            ],
            "trials": 16,
            "sets": [],
        },
        "overhead": {"trials": 8, "sets": ["train.max_steps=40", "eval.every_steps=10"]},
        "workers": {"trials": 4, "sets": ["train.max_steps=100", "eval.every_steps=20"]},
    }


# ----------------------------------------------------------------------------- commands


def warm(recipe: Path, workspace: Path, extra: list[str]) -> None:
    """One short run, so the data and tokens every trial reads exist already."""
    ledgerlm(["run", str(recipe), *sets([*extra, "train.max_steps=1"])], workspace)


def study(
    recipe: Path,
    workspace: Path,
    name: str,
    params: list[str],
    flags: list[str],
    extra: list[str],
) -> dict[str, Any]:
    """``ledgerlm tune`` and the figures of its record."""
    from ledgerlm.lab.tune.record import load_study
    from ledgerlm.workspace import Workspace

    args = ["tune", str(recipe), "--study", name, "--json", *flags]
    wall = ledgerlm([*args, *(a for p in params for a in ("--param", p)), *sets(extra)], workspace)
    record = load_study(Workspace(workspace), name)
    trials = record["trials"]
    statuses: dict[str, int] = {}
    for t in trials:
        statuses[t["status"]] = statuses.get(t["status"], 0) + 1
    best = record["best"]
    return {
        "study": name,
        "command_s": wall,
        "study_s": record["seconds"],
        "device_s": record["device_seconds"],
        "device_h": record["device_seconds"] / 3600,
        "trials": len(trials),
        "statuses": statuses,
        "trial_s": [t["seconds"] for t in trials],
        "best_value": best["value"] if best else None,
        "best_reached": bool(best)
        and any(t["number"] == best["number"] and t["status"] == "reached" for t in trials),
        "best_overrides": best["overrides"] if best else None,
    }


def latest_run(workspace: Path) -> dict[str, Any]:
    from ledgerlm.ledger.store import Ledger

    with Ledger(workspace / "ledger.db") as ledger:
        return ledger.run_summary(ledger.list_runs()[0]["id"])


# ----------------------------------------------------------------------------- sections


def pruning(cfg: dict[str, Any], seed: int, work: Path) -> dict[str, Any]:
    recipe, params, extra = cfg["recipe"], cfg["params"], cfg["sets"]
    warm(recipe, work, extra)
    sides = {}
    for pruner in ("none", "asha"):  # one workspace: both read the same data and tokens
        flags = ["--trials", str(cfg["trials"]), "--sampler", "tpe", "--pruner", pruner]
        flags += ["--seed", str(seed)]
        sides[pruner] = study(recipe, work, f"bench-{pruner}", params, flags, extra)
        s = sides[pruner]
        print(
            f"  {pruner:<5} best {_num(s['best_value'])} device-s (reached {s['best_reached']}), "
            f"{s['device_h']:.4f} device-h, {s['statuses']}, study {s['study_s']:.1f} s",
            flush=True,
        )
    none, asha = sides["none"], sides["asha"]
    saved = 1 - asha["device_s"] / none["device_s"] if none["device_s"] else None
    within = None
    if none["best_reached"] and asha["best_reached"]:
        within = asha["best_value"] <= (1 + GOAL_BEST) * none["best_value"]
    ledgerlm(["run", str(recipe), "--from-tune", "bench-asha", *sets(extra)], work)
    charged = latest_run(work)
    verdict = charged.get("time_to_target") or {}
    search = [p for p in charged["phases"] if p["kind"] == "search"]
    search_s = sum(p["seconds"] or 0.0 for p in search)
    search_dev = sum(p.get("device_seconds") or 0.0 for p in search)
    chosen = {
        "reached": bool(verdict.get("reached")),
        "ttt_s": verdict.get("seconds"),
        "ttt_device_s": verdict.get("device_seconds"),
        "search_s": search_s,
        "search_device_s": search_dev,
        "ttt_without_search_s": None
        if verdict.get("seconds") is None
        else verdict["seconds"] - search_s,
    }
    print(
        f"  device time saved by ASHA {_pct(saved)} (goal >= {GOAL_SAVED:.0%}); best within "
        f"{GOAL_BEST:.0%}: {within}; the chosen recipe's time-to-target "
        f"{_num(chosen['ttt_s'])} s with the search, {_num(chosen['ttt_without_search_s'])} s "
        f"without",
        flush=True,
    )
    return {"sides": sides, "saved_share": saved, "best_within": within, "chosen": chosen}


def overhead(cfg: dict[str, Any], seed: int, work: Path) -> dict[str, Any]:
    tiny, extra, n = ROOT / "configs" / "tiny.toml", cfg["sets"], cfg["trials"]
    warm(tiny, work, extra)
    ledgerlm(["run", str(tiny), *sets(extra)], work)  # the baseline: one plain run
    run = latest_run(work)  # its wall less the command's start-up, as a trial counts it
    starting = sum(p["seconds"] or 0.0 for p in run["phases"] if p["kind"] == "startup")
    plain = run["total_seconds"] - starting
    flags = ["--sampler", "grid", "--pruner", "none"]
    # Two studies of n and 2n trials: what the larger spends outside its trial runs
    # beyond what the smaller does, per extra trial, is the study's cost of one more
    # trial; what is left is paid once per command (opening the study, the first
    # model built in the process).
    studies = []
    for size, first in ((n, seed), (2 * n, seed + n)):
        grid = [f"train.seed=choice:{','.join(str(first + i) for i in range(size))}"]
        sized = [*flags, "--trials", str(size)]
        studies.append(study(tiny, work, f"bench-overhead-{size}", grid, sized, extra))
    small, big = studies
    outside = [s["study_s"] - sum(s["trial_s"]) for s in studies]
    per_trial = (outside[1] - outside[0]) / (big["trials"] - small["trials"])
    once = outside[0] - per_trial * small["trials"]
    trial = statistics.median(big["trial_s"])
    start_up = big["command_s"] - big["study_s"]
    out = {
        "studies": studies,
        "plain_run_s": plain,
        "plain_run_phases": run.get("phase_totals"),
        "median_trial_s": trial,
        "overhead_per_trial_s": per_trial,
        "overhead_share": per_trial / trial,
        "once_per_study_s": once,
        "start_up_s": start_up,
    }
    print(
        f"  {big['trials']} trials of {trial:.2f} s (a plain run {plain:.2f} s): the study "
        f"costs {per_trial:.3f} s per more trial = {_pct(out['overhead_share'])} of a trial "
        f"(goal < {GOAL_OVERHEAD:.0%}), {once:.2f} s once per command beside the command's "
        f"start-up of {start_up:.2f} s",
        flush=True,
    )
    return out


def workers(cfg: dict[str, Any], seed: int, work: Path, ray: bool) -> dict[str, Any]:
    tiny, extra, n = ROOT / "configs" / "tiny.toml", cfg["sets"], cfg["trials"]
    warm(tiny, work, extra)
    grid = [f"train.seed=choice:{','.join(str(seed + i) for i in range(n))}"]
    sides = {
        "sequential": ["--workers", "1"],
        "2 local workers": ["--workers", "2"],
    }
    if ray:
        sides["2 on a local Ray"] = [
            *["--workers", "2", "--executor", "ray", "--trial-resources", "cpu=1"]
        ]
    out = {}
    for i, (side, flags) in enumerate(sides.items()):
        flags = ["--sampler", "grid", "--pruner", "none", *flags]  # every trial trains whole
        s = study(tiny, work, f"bench-workers-{i}", grid, flags, extra)
        out[side] = s
        print(
            f"  {side:<17} wall {s['command_s']:.1f} s (study {s['study_s']:.1f} s), device "
            f"{s['device_s']:.1f} s, {s['statuses']}",
            flush=True,
        )
    base = out["sequential"]
    for s in out.values():
        s["wall_vs_sequential"] = s["command_s"] / base["command_s"]
        s["device_vs_sequential"] = s["device_s"] / base["device_s"] if base["device_s"] else None
    return out


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every section small (minutes)")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="these sections")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument("--ray", action="store_true", help="workers: also 2 on a local Ray")
    parser.add_argument("--workspace", type=Path, help="keep the workspaces here")
    parser.add_argument(
        "--recipe", type=Path, help="pruning: this recipe instead of the demo's (e.g. tiny)"
    )
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="pruning: recipe overrides"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cfg = settings(args.quick)
    if args.recipe is not None:
        cfg["pruning"].update(recipe=args.recipe.resolve(), sets=args.sets)
    print(f"python bench/tune_study.py {' '.join(sys.argv[1:])}; {load()}", flush=True)
    result: dict[str, Any] = {"quick": args.quick, "seed": args.seed, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workspace or Path(tmp)
        for name in args.only or SECTIONS:
            print(f"{name}:", flush=True)
            work = root / name
            if name == "workers":
                out = measured(workers, cfg[name], args.seed, work, args.ray)
            else:
                out = measured(globals()[name], cfg[name], args.seed, work)
            result[name] = out
    if args.json:
        print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
