"""``ledgerlm mix fit`` benchmark: the whole command, end to end, on a table of 512 proxy
runs x 17 domains (the requirement: under 5 s on a 2-core machine).

Each repetition runs, as subprocesses and in alternation (these machines are shared and
noisy):

- the baseline: ``python -c "import ledgerlm.cli.main"``, the CLI's own start-up, which
  every command pays (typer, rich, and the lab behind it: PyTorch);
- the command: ``python -m ledgerlm mix fit --csv runs.csv --target loss --predict
  mixtures.csv --json`` (read both tables, import LightGBM, 5-fold cross-validation and
  the refit, 100,000 candidate mixtures scored for the recommendation, 64 predictions).

The difference is the fit's own share. One in-process pass through the library then
splits that share into its steps. The synthetic table: mixtures drawn from a Dirichlet
around a skewed natural mixture, the loss a smooth function of the weights plus noise.

    python bench/mix_fit.py                  # about half a minute on 2 cores
    python bench/mix_fit.py --repeat 5 --json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ledgerlm.mixture.dirichlet import concentration_of, dirichlet_around
from ledgerlm.mixture.recommend import recommend
from ledgerlm.mixture.regress import fit_regression
from ledgerlm.mixture.table import read_mixture_table
from machine_load import cpu_jiffies, foreign_load, own_cpu

GOAL_S = 5.0  # the whole command, end to end
ROWS, DOMAINS, PREDICT_ROWS = 512, 17, 64


def write_tables(folder: Path, seed: int) -> tuple[Path, Path]:
    """runs.csv (run name, 17 weights, loss) and mixtures.csv (64 mixtures to predict)."""
    rng = np.random.default_rng(seed)
    natural = 0.8 ** np.arange(DOMAINS)  # a skewed natural mixture
    natural /= natural.sum()
    w = dirichlet_around(natural, 2.0 * DOMAINS, ROWS, seed=seed)
    gain = rng.uniform(0.5, 1.5, DOMAINS) / DOMAINS
    loss = 2.0 + (gain * -np.log(w + 1e-3)).sum(axis=1) + rng.normal(0, 0.01, ROWS)
    names = [f"d{i:02d}" for i in range(DOMAINS)]
    runs, mixtures = folder / "runs.csv", folder / "mixtures.csv"
    with open(runs, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["run", *names, "loss"])
        for i in range(ROWS):
            out.writerow([f"proxy-{i:03d}", *map(repr, map(float, w[i])), repr(float(loss[i]))])
    new = dirichlet_around(natural, 2.0 * DOMAINS, PREDICT_ROWS, seed=seed + 1)
    with open(mixtures, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(names)
        out.writerows([list(map(repr, map(float, r))) for r in new])
    return runs, mixtures


def timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        sys.exit(f"mix_fit: {' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return seconds, proc.stdout


def in_process(runs: Path, mixtures: Path) -> dict[str, float]:
    """The fit's steps through the library, once (LightGBM imported inside ``fit``)."""
    steps: dict[str, float] = {}
    t = time.perf_counter()
    table = read_mixture_table(runs, "loss")
    other = read_mixture_table(mixtures, None, domains=table.domains)
    steps["read both tables"] = time.perf_counter() - t
    t = time.perf_counter()
    import lightgbm  # noqa: F401

    steps["import lightgbm"] = time.perf_counter() - t
    t = time.perf_counter()
    assert table.target is not None
    reg = fit_regression(table.weights, table.target, table.domains)
    steps["5-fold cross-validation + refit"] = time.perf_counter() - t
    t = time.perf_counter()
    best = recommend(reg.predict, table.weights.mean(axis=0), concentration_of(table.weights))
    steps["recommend (100,000 candidates)"] = time.perf_counter() - t
    t = time.perf_counter()
    reg.predict(best[None, :])
    reg.predict(other.weights)
    steps[f"predict ({PREDICT_ROWS + 1} mixtures)"] = time.perf_counter() - t
    return steps


def run(args) -> dict:
    py = sys.executable
    baseline_cmd = [py, "-c", "import ledgerlm.cli.main"]
    with tempfile.TemporaryDirectory() as tmp:
        runs, mixtures = write_tables(Path(tmp), args.seed)
        fit_cmd = [py, "-m", "ledgerlm", "mix", "fit", "--csv", str(runs), "--target", "loss"]
        fit_cmd += ["--predict", str(mixtures), "--json"]
        load, own = cpu_jiffies(), own_cpu()  # the subprocesses are ours
        timed(baseline_cmd)  # warm the page cache and the bytecode caches; not counted
        base, full, result = [], [], {}
        for _ in range(args.repeat):
            base.append(timed(baseline_cmd)[0])
            seconds, stdout = timed(fit_cmd)
            full.append(seconds)
            result = json.loads(stdout)
        steps = in_process(runs, mixtures)
        load_share = foreign_load(load, own)
    return {
        "rows": result["rows"],
        "domains": len(result["domains"]),
        "predictions": len(result["predictions"]),
        "model": result["model"],
        "cv": result["cv"],
        "repeat": args.repeat,
        "baseline_s": base,
        "command_s": full,
        "steps_s": steps,
        "foreign_load": load_share,
    }


def report(r: dict) -> None:
    base, full = statistics.median(r["baseline_s"]), statistics.median(r["command_s"])
    cv = r["cv"]
    print(
        f"{r['rows']} runs x {r['domains']} domains, {r['predictions']} mixtures to predict; "
        f"model {r['model']}, {cv['folds']}-fold CV Spearman {cv['spearman']:.3f}, "
        f"RMSE {cv['rmse']:.4f}; median of {r['repeat']} alternating runs"
    )
    print()
    print("| measured | median s | min .. max s | x baseline |")
    print("|---|---:|---:|---:|")
    rows = [
        ("baseline: python -c 'import ledgerlm.cli.main'", r["baseline_s"]),
        ("python -m ledgerlm mix fit ... --predict ... --json", r["command_s"]),
    ]
    for name, values in rows:
        print(
            f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} .. "
            f"{max(values):.2f} | {statistics.median(values) / base:.2f} |"
        )
    print(f"| the fit's own share (difference of medians) | {full - base:.2f} | | "
          f"{(full - base) / base:.2f} |")  # fmt: skip
    print()
    print("| in process, once | s |")
    print("|---|---:|")
    for name, seconds in r["steps_s"].items():
        print(f"| {name} | {seconds:.3f} |")
    print(f"| total | {sum(r['steps_s'].values()):.3f} |")
    print()
    load = r["foreign_load"]
    print(
        f"goal (< {GOAL_S:g} s end to end): {'met' if full < GOAL_S else 'NOT met'} "
        f"(median {full:.2f} s); other processes used "
        + ("an unknown share" if load is None else f"{100 * load:.0f}%")
        + " of the CPU meanwhile"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="alternating baseline/command runs")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic table")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()
    r = run(args)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        report(r)


if __name__ == "__main__":
    main()
