"""What checking a reused version costs per GB (``tokens.verify``, ``data.verify``).

A reused token version is read once on every reuse: each shard's ids are checked
against the vocabulary (a vectorised max per 8 MiB chunk) and, by default, hashed with
the sha256 its manifest holds (``--no-verify`` skips the hash, not the read). A data
version's Parquet shards are hashed the same way. The cheap checks (sizes, counts,
footers, the document index) are O(files + documents), not O(bytes), and are left out.

The script writes one shard of random uint16 ids (vocabulary 32,000) of ``--gb`` GB in
a temporary folder and times, in alternation: the scan with the hash (the default), the
scan without it (``--no-verify``) and a plain sha256 of the file (a data shard). The
file was just written, so it is read from the page cache: these are CPU costs, a lower
bound of a read from a cold disk. Also shown, for the choice of hash: hashlib's blake2b
over the same bytes.

    python bench/verify_versions.py              # about a minute on 2 cores
    python bench/verify_versions.py --gb 2 --repeat 5 --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ledgerlm.tokens.verify import scan_shard
from ledgerlm.workspace import file_sha256
from machine_load import cpu_jiffies, foreign_load, own_cpu

VOCAB = 32_000


def _blake2b(path: Path) -> str:
    h = hashlib.blake2b()
    with open(path, "rb") as f:
        while block := f.read(1 << 23):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the shard (GB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.bin"
        rng = np.random.default_rng(0)
        n = int(args.gb * 1e9) // 2
        with open(path, "wb") as f:
            for start in range(0, n, 1 << 24):
                ids = rng.integers(0, VOCAB, min(1 << 24, n - start), dtype=np.uint16)
                f.write(ids.tobytes())
        gb = path.stat().st_size / 1e9
        digest = file_sha256(path)  # what publishing stored
        ways = {
            "tokens, default (max + sha256)": lambda: scan_shard(
                path, np.dtype(np.uint16), VOCAB, digest
            ),
            "tokens, --no-verify (max only)": lambda: scan_shard(
                path, np.dtype(np.uint16), VOCAB, None
            ),
            "data shard (sha256)": lambda: file_sha256(path),
            "for comparison: blake2b": lambda: _blake2b(path),
        }
        seconds: dict[str, list[float]] = {k: [] for k in ways}
        load0, own0 = cpu_jiffies(), own_cpu()
        for _ in range(args.repeat):
            for name, fn in ways.items():
                t = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - t)
        load = foreign_load(load0, own0)
    rows = {
        name: {"s_per_gb": statistics.median(s) / gb, "gb_per_s": gb / statistics.median(s)}
        for name, s in seconds.items()
    }
    if args.json:
        print(json.dumps({"gb": gb, "repeat": args.repeat, "foreign_load": load, "rows": rows}))
        return
    print(f"{gb:.2f} GB shard, page cache warm, median of {args.repeat}")
    for name, r in rows.items():
        print(f"  {name:34s} {r['s_per_gb']:6.2f} s/GB  ({r['gb_per_s']:.2f} GB/s)")
    if load is not None:
        print(f"other processes used {load:.0%} of the machine's CPU meanwhile")


if __name__ == "__main__":
    main()
