"""``ledgerlm scale fit --csv`` on long tables: wall time and peak memory of the whole
command, as a subprocess, on a synthetic table of ``--rows`` points.

The table: N log-uniform in [1e7, 1e10], D log-uniform in [1e9, 1e12] (every row its
own (N, D)), the loss from a known law (E 1.8, A 450, B 2100, alpha 0.34, beta 0.37)
times 1% log-normal noise, written to a temporary CSV. The same command on a table of
``--small`` rows runs first: the difference is what the rows themselves cost. Peak
memory is the child's own maximum resident set (``os.wait4``), in MiB.

    python bench/scaling_fit_memory.py                                # 10^5 rows, no bootstrap
    python bench/scaling_fit_memory.py --rows 1000000                 # goal: < 1 GiB, < 2 min
    python bench/scaling_fit_memory.py --rows 100000 --bootstrap 200  # goal: < 1 GiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ledgerlm.scaling.law import LawParams
from machine_load import cpu_jiffies, foreign_load, own_cpu

TRUE = LawParams(E=1.8, A=450.0, B=2100.0, alpha=0.34, beta=0.37)
GOAL_MIB = 1024.0  # peak resident memory, any table
GOAL_S = 120.0  # wall time, with --bootstrap 0


def write_table(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    N = 10 ** rng.uniform(7, 10, rows)
    D = 10 ** rng.uniform(9, 12, rows)
    loss = TRUE.predict(N, D) * np.exp(rng.normal(0, 0.01, rows))
    np.savetxt(path, np.c_[N, D, loss], fmt="%.6g", delimiter=",", header="N,D,loss", comments="")


def measure(csv: Path, bootstrap: int) -> dict:
    """Wall seconds, the child's peak RSS (MiB) and the fit's status line."""
    cmd = [sys.executable, "-m", "ledgerlm", "scale", "fit", "--csv", str(csv)]
    cmd += ["--bootstrap", str(bootstrap)]
    with tempfile.TemporaryFile("w+") as out:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        sys.exit(f"scaling_fit_memory: {' '.join(cmd)} failed:\n{text}")
    status_line = next((x for x in text.splitlines() if x.startswith("fit ")), "")
    return {"wall_s": wall, "peak_mib": usage.ru_maxrss / 1024.0, "fit": status_line.strip()}


def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        small, large = Path(tmp) / "small.csv", Path(tmp) / "large.csv"
        write_table(small, args.small, args.seed)
        write_table(large, args.rows, args.seed)
        size = large.stat().st_size
        load, own = cpu_jiffies(), own_cpu()
        base = measure(small, args.bootstrap)
        big = measure(large, args.bootstrap)
        share = foreign_load(load, own)
    per_row = (big["peak_mib"] - base["peak_mib"]) * 2**20 / (args.rows - args.small)
    return {
        "rows": args.rows,
        "small_rows": args.small,
        "bootstrap": args.bootstrap,
        "csv_bytes": size,
        "small": base,
        "large": big,
        "bytes_per_row": per_row,
        "goal_mib": GOAL_MIB,
        "goal_s": GOAL_S if args.bootstrap == 0 else None,
        "foreign_load": share,
        "cpus": os.cpu_count(),
    }


def report(r: dict) -> None:
    print(
        f"ledgerlm scale fit --csv (synthetic table, {r['csv_bytes'] / 1e6:.1f} MB at "
        f"{r['rows']:,} rows) --bootstrap {r['bootstrap']}"
    )
    print()
    print("| rows | wall s | peak RSS MiB | fit |")
    print("|---:|---:|---:|---|")
    for n, m in ((r["small_rows"], r["small"]), (r["rows"], r["large"])):
        print(f"| {n:,} | {m['wall_s']:.1f} | {m['peak_mib']:.0f} | {m['fit']} |")
    print()
    big = r["large"]
    ok = big["peak_mib"] < r["goal_mib"]
    goals = f"peak < {r['goal_mib']:.0f} MiB: {'yes' if ok else 'NO'}"
    if r["goal_s"] is not None:
        fast = big["wall_s"] < r["goal_s"]
        goals += f"; wall < {r['goal_s']:.0f} s: {'yes' if fast else 'NO'}"
    load = r["foreign_load"]
    print(f"{r['bytes_per_row']:.0f} bytes of peak memory per row beyond the small table")
    print(
        f"{goals}; other processes used "
        + ("an unknown share" if load is None else f"{100 * load:.0f}%")
        + f" of the {r['cpus']} CPUs meanwhile"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000, help="rows of the long table")
    ap.add_argument("--small", type=int, default=1_000, help="rows of the small table")
    ap.add_argument("--bootstrap", type=int, default=0, help="bootstrap refits (--bootstrap)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 5 <= args.small < args.rows:
        sys.exit("scaling_fit_memory: need 5 <= --small < --rows")
    r = run(args)
    print(json.dumps(r, indent=2)) if args.json else report(r)


if __name__ == "__main__":
    main()
