"""The data stage end to end: ``ledgerlm data prepare`` against a datasketch script.

Both sides are timed as whole commands (a subprocess each: interpreter and import
start-up, JSONL parsing, the dedup, writing the result) on the same JSONL file, in the
same run, alternating, ``--repeat`` times each:

* ledgerlm: ``ledgerlm data prepare`` with its default steps (templates, filters, exact
  dedup, MinHash near dedup with verification, split, Parquet shards, manifest) and
  ``workers = 0`` (all cores); near dedup with FineWeb's setting: 5-word shingles, 112
  permutations as 14 bands x 8 rows, candidate pairs verified by exact Jaccard >= 0.8.
* datasketch: the straightforward script (``baseline_child`` below): ``json.loads`` each
  line, the same words (NFKC + casefold, whitespace split), 5-word shingles,
  ``MinHash(num_perm=112).update_batch``, ``MinHashLSH(params=(14, 8))`` insert and
  query, union-find, and the kept records written back as JSONL. No verification.

The corpus (cached under ``--corpus-dir``): documents of ~1.5 KB made of four runs of
consecutive lines of the standard library's ``.py`` files at random places; one document
in ten is an edited copy of an earlier one (0-5% of its words replaced, a few appended),
so near duplicates sit on both sides of the 0.8 threshold. No ids: ledgerlm names each
document by its line (``source:file:line``).

Reported per size: documents/s and MB/s (JSONL bytes), the ratio, peak RSS (the sum over
the process tree and its largest process) and user+sys CPU / wall (cores busy), both
sampled every 50 ms with psutil over every process the command starts, per-document wall
time and memory so growth with size shows, and ledgerlm's seconds per pass. Also: a 1 MB
plain-text corpus (paragraphs of Python's docs, ``examples/python_docs_text.py``)
prepared with every step off (templates, filters, exact and near dedup), timed in
process as the ``prep`` phase of a run sees it (``prepare_data`` after the imports) and
as a whole command. The machine's load average and the CPU share used by other
processes are printed beside the figures: on a shared machine, read the min column.

    .venv/bin/python bench/data_prepare.py --quiet-load 1.5     # 20k and 200k, 3 repeats
    .venv/bin/python bench/data_prepare.py --docs 20000,200000,1000000 --repeat 3
    .venv/bin/python bench/data_prepare.py --docs 20000 --workers 1   # one core

The datasketch script runs up to ``--baseline-max`` documents (200,000: extrapolated, 1M
would take it ~7 minutes and ~9 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from machine_load import cpu_jiffies

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHINGLE, BANDS, ROWS = 5, 14, 8


# ----------------------------------------------------------------------------- corpus


def _line_pool(max_chars: int = 40_000_000) -> list[str]:
    """Lines of the standard library's .py files, in sorted file order (tests excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & {"site-packages", "dist-packages", "test", "tests", "idle_test"}:
            continue
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for line in text.splitlines():
            if line.strip():
                lines.append(line.rstrip())
                size += len(line)
        if size >= max_chars:
            break
    return lines


def _edited(text: str, rate: float, rng: random.Random) -> str:
    words = text.split(" ")
    for _ in range(max(1, round(rate * len(words))) if rate > 0 else 0):
        i = rng.randrange(len(words))
        words[i] = words[rng.randrange(len(words))] + "x"
    words += [words[rng.randrange(len(words))] for _ in range(rng.randrange(4))]
    return " ".join(words)


def make_corpus(path: Path, docs: int, seed: int = 0, dup_fraction: float = 0.1) -> Path:
    """``docs`` JSONL records {"text": ...}; cached by size and seed."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    pool = _line_pool()
    texts: list[str] = []
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i in range(docs):
            if i > 10 and rng.random() < dup_fraction:
                text = _edited(texts[rng.randrange(len(texts))], rng.uniform(0.0, 0.05), rng)
            else:
                runs = []
                for _ in range(4):
                    at = rng.randrange(len(pool) - 10)
                    runs.append("\n".join(pool[at : at + rng.randint(5, 11)]))
                text = "\n".join(runs)
            if len(texts) < 50_000:
                texts.append(text)
            else:
                texts[rng.randrange(len(texts))] = text
            f.write(json.dumps({"text": text}) + "\n")
    tmp.replace(path)
    return path


def make_text(path: Path, chars: int = 1_000_000) -> Path:
    if not path.is_file():
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "python_docs_text.py"), str(path),
             "--chars", str(chars)],
            check=True, capture_output=True,
        )  # fmt: skip
    return path


# ----------------------------------------------------------------------------- baseline


def baseline_child(src: str, dst: str) -> None:
    """The datasketch script: read, shingle, MinHash, LSH, cluster, write what is kept."""
    import unicodedata

    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=BANDS * ROWS, params=(BANDS, ROWS))
    sketches = []
    lines = []
    with open(src, encoding="utf-8") as f:
        for i, line in enumerate(f):
            text = json.loads(line)["text"]
            words = unicodedata.normalize("NFKC", text).casefold().split()
            if len(words) < SHINGLE:
                shingles = [" ".join(words).encode()] if words else []
            else:
                shingles = [
                    " ".join(words[j : j + SHINGLE]).encode()
                    for j in range(len(words) - SHINGLE + 1)
                ]
            m = MinHash(num_perm=BANDS * ROWS, seed=1)
            m.update_batch(shingles)
            lsh.insert(i, m)
            sketches.append(m)
            lines.append(line)
    parent = list(range(len(sketches)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, m in enumerate(sketches):
        for j in lsh.query(m):
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    kept = 0
    with open(dst, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if find(i) == i:
                out.write(line)
                kept += 1
    print(json.dumps({"docs": len(lines), "kept": kept}))


# ----------------------------------------------------------------------------- measuring


def _sample(root, seen: dict[int, float]) -> tuple[int, int]:
    """(RSS of the whole tree, of its largest process); records each process's CPU."""
    import psutil

    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total = largest = 0
    for p in procs:
        try:
            with p.oneshot():
                rss = p.memory_info().rss
                t = p.cpu_times()
        except psutil.Error:
            continue
        seen[p.pid] = t.user + t.system
        total += rss
        largest = max(largest, rss)
    return total, largest


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> dict:
    """Wall time, user+sys CPU and peak RSS of a command and every process it starts.

    Sampled every 50 ms with psutil over the process tree: worker processes forked by
    a fork server are not waited for by the command, so ``RUSAGE_CHILDREN`` would miss
    them. Each process's CPU is its last sample (at most 50 ms short).
    """
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    root = psutil.Process(proc.pid)
    peak = [0, 0]
    cpu: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            tree, largest = _sample(root, cpu)
            peak[0], peak[1] = max(peak[0], tree), max(peak[1], largest)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {
        "wall": wall,
        "cpu": sum(cpu.values()),
        "tree_rss": peak[0],
        "max_rss": peak[1],
        "processes": len(cpu),
        "stdout": out,
    }


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min), {os.cpu_count()} cores"


def wait_for_quiet(limit: float, seconds: float) -> None:
    """Wait until the 1-minute load average is below ``limit`` (at most ``seconds``)."""
    deadline = time.time() + seconds
    while os.getloadavg()[0] >= limit and time.time() < deadline:
        print(f"  waiting for a quieter machine: {load()}", flush=True)
        time.sleep(30)


def recipe(folder: Path, source: str, extra: str = "", workers: int = 0) -> Path:
    path = folder / "recipe.toml"
    path.write_text(
        f"[data]\nsources = [{source}]\nworkers = {workers}\n{extra}"
        f"[data.near_dedup]\nverify = true\nshingle_words = {SHINGLE}\n"
        f"bands = {BANDS}\nrows = {ROWS}\n"
    )
    return path


ALL_OFF = """exact_dedup = false
[data.templates]
enabled = false
[data.filters]
min_chars = 0
max_duplicate_line_fraction = 1.0
max_top_ngram_fraction = 1.0
max_symbol_ratio = 1.0
"""


def _phases(stdout: str) -> dict[str, float]:
    """Seconds per pass from the progress lines ``[ 1.2 s] data: read 7/7 done``."""
    out = {}
    for m in re.finditer(r"\[\s*([0-9.]+) s\] data: ([a-z -]+?) \d+/\d+ done", stdout):
        out[m.group(2)] = float(m.group(1))
    return out


def one_size(docs: int, args: argparse.Namespace, tmp: Path) -> dict:
    corpus = make_corpus(args.corpus_dir / f"corpus-{docs}-s{args.seed}.jsonl", docs, args.seed)
    mb = corpus.stat().st_size / 1e6
    folder = tmp / f"n{docs}"
    folder.mkdir()
    rec = recipe(folder, f'{{path = "{corpus}"}}', workers=args.workers)
    rows: dict[str, list[dict]] = {"ledgerlm": [], "datasketch": []}
    baseline = not args.skip_baseline and docs <= args.baseline_max
    for rep in range(args.repeat):  # alternating, so both see the same machine
        ws = folder / f"ws{rep}"
        cmd = [str(BIN / "ledgerlm"), "data", "prepare", str(rec), "-w", str(ws)]
        run = timed(cmd, folder)
        run["phases"] = _phases(run["stdout"])
        rows["ledgerlm"].append(run)
        shutil.rmtree(ws)
        if baseline:
            out = folder / "kept.jsonl"
            cmd = [sys.executable, __file__, "--baseline-child", str(corpus), str(out)]
            rows["datasketch"].append(timed(cmd, folder))
            out.unlink()
        print(f"  {docs} documents, repeat {rep + 1}: ledgerlm {rows['ledgerlm'][-1]['wall']:.2f} s"
              + (f", datasketch {rows['datasketch'][-1]['wall']:.2f} s" if baseline else "")
              + f" ({load()})", flush=True)  # fmt: skip
    return {"docs": docs, "mb": mb, "rows": rows}


def all_off(args: argparse.Namespace, tmp: Path) -> dict:
    text = make_text(args.corpus_dir / "python-docs-1mb.txt")
    folder = tmp / "off"
    folder.mkdir()
    source = f'{{path = "{text}", split = "blank_lines", domain = "docs"}}'
    rec = recipe(folder, source, 'split = "document"\nval_fraction = 0.02\n' + ALL_OFF)
    rec.write_text(rec.read_text().replace("verify = true", "enabled = false"))
    inproc, inproc_runs, cli = [], [], []
    code = (
        "import sys, time; from pathlib import Path\n"
        "from ledgerlm.config import load_recipe\n"
        "from ledgerlm.data.pipeline import prepare_data\n"
        "from ledgerlm.workspace import Workspace\n"
        "cfg = load_recipe(Path(sys.argv[1])).data_stage()\n"
        "t = time.perf_counter(); prepare_data(cfg, Workspace(Path(sys.argv[2])))\n"
        "print(time.perf_counter() - t)\n"
    )
    for rep in range(args.repeat):
        ws = folder / f"ws{rep}"
        r = timed([sys.executable, "-c", code, str(rec), str(ws)], folder)
        inproc.append(float(r["stdout"].strip().splitlines()[-1]))
        inproc_runs.append(r)
        shutil.rmtree(ws)
        cli.append(
            timed([str(BIN / "ledgerlm"), "data", "prepare", str(rec), "-w", str(ws)], folder)
        )
        shutil.rmtree(ws)
    return {
        "mb": text.stat().st_size / 1e6,
        "inproc": inproc,
        "inproc_runs": inproc_runs,
        "cli": cli,
    }


def _mmm(values: list[float], fmt: str = "{:.2f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def report(sizes: list[dict], off: dict | None, foreign: float | None) -> None:
    print()
    print(f"machine: {load()}; CPU used by other processes during the run: "
          + (f"{foreign:.0%}" if foreign is not None else "unknown"))  # fmt: skip
    print("wall: min/median/max over repeats; docs/s, MB/s, x datasketch, us/doc from the "
          "median; CPU/wall = user+sys over wall (cores busy); RSS: peak of the sum over "
          "the process tree / of its largest process (MB)")  # fmt: skip
    head = ("docs", "MB", "pipeline", "wall s", "docs/s", "MB/s", "x ds", "CPU/wall",
            "RSS sum", "RSS max", "us/doc", "KB/doc")  # fmt: skip
    line = "{:>9} {:>7} {:<10} {:>17} {:>8} {:>6} {:>6} {:>8} {:>8} {:>8} {:>7} {:>7}"
    print(line.format(*head))
    for s in sizes:
        med = {k: statistics.median([r["wall"] for r in v]) for k, v in s["rows"].items() if v}
        for name, runs in s["rows"].items():
            if not runs:
                continue
            w = med[name]
            ratio = f"{med['datasketch'] / w:.2f}" if "datasketch" in med else "-"
            cores = statistics.median([r["cpu"] / r["wall"] for r in runs])
            tree = max(r["tree_rss"] for r in runs) / 1e6
            largest = max(r["max_rss"] for r in runs) / 1e6
            print(line.format(
                s["docs"], f"{s['mb']:.1f}", name, _mmm([r["wall"] for r in runs]),
                f"{s['docs'] / w:.0f}", f"{s['mb'] / w:.2f}", ratio, f"{cores:.2f}",
                f"{tree:.0f}", f"{largest:.0f}", f"{w / s['docs'] * 1e6:.1f}",
                f"{tree * 1e3 / s['docs']:.2f}",
            ))  # fmt: skip
    print()
    print("ledgerlm passes (median s): " + "; ".join(
        f"{s['docs']}: " + ", ".join(
            f"{k} {statistics.median([r['phases'].get(k, 0) for r in s['rows']['ledgerlm']]):.2f}"
            for k in ("read", "clean", "dedup", "write")
        ) for s in sizes
    ))  # fmt: skip
    if len(sizes) > 1:
        a, b = sizes[0], sizes[-1]
        wa = statistics.median([r["wall"] for r in a["rows"]["ledgerlm"]])
        wb = statistics.median([r["wall"] for r in b["rows"]["ledgerlm"]])
        print(f"growth {a['docs']} -> {b['docs']} documents (x{b['docs'] / a['docs']:.0f}): "
              f"ledgerlm wall x{wb / wa:.1f}")  # fmt: skip
    if off:
        cli = [r["wall"] for r in off["cli"]]
        print()
        print(f"1 MB plain text ({off['mb']:.2f} MB, paragraphs), every step off: prepare_data "
              f"in process {_mmm(off['inproc'])} s; `ledgerlm data prepare` {_mmm(cli)} s "
              "(min/median/max)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--docs", default="20000,200000", help="corpus sizes, comma separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="data.workers for ledgerlm (0 = all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--corpus-dir", type=Path, default=Path(tempfile.gettempdir()) / "ledgerlm-bench"
    )
    ap.add_argument("--skip-baseline", action="store_true", help="time ledgerlm only")
    ap.add_argument("--baseline-max", type=int, default=200_000,
                    help="run the datasketch script only up to this many documents")  # fmt: skip
    ap.add_argument("--no-off", action="store_true", help="skip the 1 MB all-off timing")
    ap.add_argument("--quiet-load", type=float, default=0.0,
                    help="first wait (at most 10 min) for a 1-minute load below this")  # fmt: skip
    ap.add_argument("--baseline-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_child:
        baseline_child(*args.baseline_child)
        return
    args.corpus_dir.mkdir(parents=True, exist_ok=True)
    sizes_wanted = [int(x) for x in args.docs.split(",") if x]
    for n in sizes_wanted:  # generated before any timing
        make_corpus(args.corpus_dir / f"corpus-{n}-s{args.seed}.jsonl", n, args.seed)
    if args.quiet_load:
        wait_for_quiet(args.quiet_load, 600)
    print(f"start: {load()}", flush=True)
    busy0, own0 = cpu_jiffies(), sum(os.times()[:2])
    sizes, off = [], None
    with tempfile.TemporaryDirectory(dir=args.corpus_dir) as tmp:
        for n in sizes_wanted:
            sizes.append(one_size(n, args, Path(tmp)))
        if not args.no_off:
            off = all_off(args, Path(tmp))
    busy1 = cpu_jiffies()
    foreign = None
    if busy0 and busy1 and busy1[1] > busy0[1]:
        runs = [r for s in sizes for v in s["rows"].values() for r in v]
        runs += off["cli"] + off["inproc_runs"] if off else []
        own = sum(r["cpu"] for r in runs) + sum(os.times()[:2]) - own0
        hz = os.sysconf("SC_CLK_TCK")
        foreign = max(0.0, (busy1[0] - busy0[0] - own * hz) / (busy1[1] - busy0[1]))
    report(sizes, off, foreign)


if __name__ == "__main__":
    main()
