"""How long the command line makes a user wait before it answers: ``ledgerlm --help``
and two subcommands' ``--help`` as fresh processes, against a bare interpreter's start
and against ``import torch`` measured in the same run (the machine is shared: a ratio
moves less than a second count). Start-up imports no heavy library
(``tests/test_cli_startup.py`` holds that); this measures what the rest costs.

Each command runs ``--repeat`` times, the runs of every command interleaved; the
figure is the fastest (the least disturbed by other processes) and the median.

    python bench/cli_startup.py              # about 30 s on 2 cores
    python bench/cli_startup.py --repeat 20 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine_load import measured

LEDGERLM = str(Path(sys.executable).with_name("ledgerlm"))
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "ledgerlm --help": [LEDGERLM, "--help"],
    "ledgerlm mix search --help": [LEDGERLM, "mix", "search", "--help"],
    "ledgerlm ledger show --help": [LEDGERLM, "ledger", "show", "--help"],
}


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - start


def timings(repeat: int) -> dict[str, object]:
    """Seconds of every command, ``repeat`` runs each, interleaved."""
    runs: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for cmd in COMMANDS.values():  # one untimed run each: the page cache warm
        wall(cmd)
    for _ in range(repeat):
        for name, cmd in COMMANDS.items():
            runs[name].append(wall(cmd))
    bare = min(runs["python -c pass"])
    torch = min(runs["python -c 'import torch'"])
    rows = {}
    for name, seconds in runs.items():
        best = min(seconds)
        rows[name] = {
            "best_s": round(best, 4),
            "median_s": round(statistics.median(seconds), 4),
            "over_bare_s": round(best - bare, 4),
            "vs_import_torch": round((best - bare) / (torch - bare), 3),
        }
    return {"repeat": repeat, "commands": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    out = measured(timings, args.repeat)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'command':30} {'best s':>7} {'median s':>9} {'over bare':>10} {'/ torch':>8}")
    for name, row in out["commands"].items():
        print(
            f"{name:30} {row['best_s']:7.3f} {row['median_s']:9.3f} "
            f"{row['over_bare_s']:10.3f} {row['vs_import_torch']:8.2f}"
        )


if __name__ == "__main__":
    main()
