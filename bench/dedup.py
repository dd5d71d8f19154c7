"""Near-dedup benchmark: ledgerlm vs datasketch on the same documents, plus memory growth.

Both sides get the same documents, the same words (ledgerlm's normalization), 5-word
shingles, 112 permutations and 14 bands x 8 rows, and both are timed from raw text to
connected components. Quality is measured against exact Jaccard over all pairs of a
sample. ``--memory N`` measures resident memory per document of a streaming run.

    python bench/dedup.py                     # speed + quality (a minute or two on 2 cores)
    python bench/dedup.py --memory 200000     # bytes per document at N/4 and N
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ledgerlm.config import BuiltinCorpusConfig
from ledgerlm.data.builtin import read_builtin
from ledgerlm.data.cluster import EdgeIndex, ShingleStore, UnionFind, cluster
from ledgerlm.data.minhash import (
    PRESETS,
    LSHParams,
    band_keys,
    minhash_flat,
    minhash_signatures,
)
from ledgerlm.data.shingles import _prenormalize, shingle_batch, shingle_hashes

PARAMS = PRESETS["fineweb"]  # 5-word shingles, 14 bands x 8 rows = 112 permutations


# ----------------------------------------------------------------------------- corpus


def edited_copy(words: list[str], rate: float, rng: np.random.Generator) -> str:
    """Replace ``rate`` of the words with other words of the same document, append a few."""
    out = list(words)
    n = max(1, round(rate * len(out)))
    for i in rng.choice(len(out), size=min(n, len(out)), replace=False):
        out[i] = words[int(rng.integers(len(words)))] + "x"
    out += [words[int(rng.integers(len(words)))] for _ in range(int(rng.integers(0, 4)))]
    return " ".join(out)


def build_corpus(args: argparse.Namespace) -> tuple[list[str], dict[int, int]]:
    """Built-in corpus plus edited copies of a random subset; returns (texts, copy->original)."""
    cfg = BuiltinCorpusConfig(
        code_docs=args.code_docs, docs_docs=args.docs_docs, math_docs=args.math_docs
    )
    texts = [d.text for d in read_builtin(cfg)]
    rng = np.random.default_rng(args.seed)
    n = len(texts)
    chosen = rng.choice(n, size=int(args.dup_fraction * n), replace=False)
    planted: dict[int, int] = {}
    for i in sorted(chosen.tolist()):
        words = texts[i].split()
        if len(words) < 20:
            continue
        # edit rates from none to 5% of the words: 5-shingle Jaccard from 1 down to ~0.6,
        # both sides of the 0.8 threshold
        texts.append(edited_copy(words, float(rng.uniform(0.0, 0.05)), rng))
        planted[len(texts) - 1] = i
    return texts, planted


# ----------------------------------------------------------------------------- ledgerlm


def run_ledgerlm(
    texts: list[str],
    params: LSHParams,
    workdir: Path,
    batch: int,
    verify: bool,
    per_doc: bool = False,
) -> tuple[np.ndarray, dict]:
    index = EdgeIndex(workdir / "edges", params, partitions=16)
    store = ShingleStore(workdir / "shingles") if verify else None
    for lo in range(0, len(texts), batch):
        ids = np.arange(lo, min(lo + batch, len(texts)), dtype=np.int64)
        if per_doc:  # the one-document API, as a caller without batches would use it
            sets = [shingle_hashes(t, params.shingle_words) for t in texts[lo : lo + batch]]
            index.add(ids, band_keys(minhash_signatures(sets, params), params))
            continue
        # Raw shingle hashes, repeats included: MinHash and the store's Jaccard ignore
        # repeats, so sorting every document into a set would be wasted work.
        sb = shingle_batch(texts[lo : lo + batch], params.shingle_words, unique=False)
        sig = minhash_flat(sb.hashes, sb.offsets, params)
        index.add(ids, band_keys(sig, params))
        if store is not None:
            store.add_flat(ids, sb.hashes, sb.offsets)
    result = cluster(index, len(texts), verify=store.jaccard if store else None)
    return result.labels, result.to_dict()


# ----------------------------------------------------------------------------- datasketch


def datasketch_shingles(text: str, k: int) -> list[bytes]:
    words = _prenormalize(text).split()  # the same words as ledgerlm
    if len(words) < k:
        return [" ".join(words).encode()] if words else []
    return [" ".join(words[i : i + k]).encode() for i in range(len(words) - k + 1)]


def run_datasketch(texts: list[str], params: LSHParams, per_shingle: bool = False) -> np.ndarray:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(num_perm=params.num_perm, params=(params.bands, params.rows))
    sketches = []
    for i, text in enumerate(texts):
        m = MinHash(num_perm=params.num_perm, seed=params.seed)
        shingles = datasketch_shingles(text, params.shingle_words)
        if per_shingle:
            for s in shingles:
                m.update(s)
        else:
            m.update_batch(shingles)
        lsh.insert(i, m)
        sketches.append(m)
    edges = [(i, j) for i, m in enumerate(sketches) for j in lsh.query(m) if j != i]
    uf = UnionFind(len(texts))
    uf.union_edges(np.array(edges, dtype=np.int64).reshape(-1, 2))
    return uf.roots()


# ----------------------------------------------------------------------------- quality


def sample_truth(
    texts: list[str], planted: dict[int, int], size: int, k: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact Jaccard of every pair of a sample: (docs, left, right, jaccard) over pairs that
    share a shingle. Half of the sample are planted (copy, original) pairs, so recall is
    measured on near-duplicates that exist; a third are random documents."""
    from scipy import sparse

    copies = rng.permutation(sorted(planted))[: size // 3]
    docs = set(copies.tolist()) | {planted[c] for c in copies.tolist()}
    rest = rng.permutation(len(texts))
    for d in rest.tolist():
        if len(docs) >= size:
            break
        docs.add(d)
    docs_arr = np.array(sorted(docs), dtype=np.int64)
    sb = shingle_batch([texts[i] for i in docs_arr], k, unique=True)
    _, cols = np.unique(sb.hashes, return_inverse=True)
    rows = np.repeat(np.arange(len(docs_arr)), sb.counts())
    x = sparse.csr_matrix(
        (np.ones(len(rows), dtype=np.float64), (rows, cols)),
        shape=(len(docs_arr), int(cols.max()) + 1 if len(cols) else 0),
    )
    inter = (x @ x.T).tocoo()
    keep = inter.row < inter.col
    left, right, both = inter.row[keep], inter.col[keep], inter.data[keep]
    sizes = sb.counts().astype(np.float64)
    jac = both / (sizes[left] + sizes[right] - both)
    return docs_arr, left, right, jac


def quality(labels: np.ndarray, truth, threshold: float) -> dict:
    docs, left, right, jac = truth
    lab = labels[docs]
    # pairs in one cluster: all of them, including pairs that share no shingle (J = 0)
    _, counts = np.unique(lab, return_counts=True)
    same_pairs = int((counts * (counts - 1) // 2).sum())
    same = lab[left] == lab[right]
    good = int(np.count_nonzero(same & (jac >= threshold)))
    positives = jac >= threshold + 0.05
    return {
        "precision": good / same_pairs if same_pairs else 1.0,
        "recall": float(np.count_nonzero(same & positives) / max(1, np.count_nonzero(positives))),
        "pairs_together": same_pairs,
        "positives": int(np.count_nonzero(positives)),
    }


# ----------------------------------------------------------------------------- memory


def synthetic_batch(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    """Random documents of 100-300 words; one in ten is an edited copy of another."""
    lengths = rng.integers(100, 301, size=n)
    words = rng.integers(0, len(vocab), size=int(lengths.sum()))
    out: list[str] = []
    at = 0
    for i, length in enumerate(lengths.tolist()):
        if i and rng.random() < 0.1:
            src = out[int(rng.integers(len(out)))].split()
            out.append(edited_copy(src, 0.02, rng))
        else:
            out.append(" ".join([vocab[w] for w in words[at : at + length].tolist()]))
        at += length
    return out


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def memory_child(n: int, batch: int, verify: bool) -> dict:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted(
        {"".join(rng.choice(letters, size=int(rng.integers(3, 10)))) for _ in range(5000)}
    )
    params = PARAMS
    with tempfile.TemporaryDirectory() as tmp:
        # The batch in flight, built once and kept alive while the baseline is read.
        texts = synthetic_batch(np.random.default_rng(1), vocab, batch)
        sb = shingle_batch(texts, params.shingle_words, unique=False)
        sig = minhash_flat(sb.hashes, sb.offsets, params)
        keys = band_keys(sig, params)
        gc.collect()
        base = rss()
        del texts, sb, sig, keys
        start = time.perf_counter()
        index = EdgeIndex(Path(tmp) / "edges", params, partitions=16)
        store = ShingleStore(Path(tmp) / "shingles") if verify else None
        gen = np.random.default_rng(2)
        for lo in range(0, n, batch):
            size = min(batch, n - lo)
            ids = np.arange(lo, lo + size, dtype=np.int64)
            texts = synthetic_batch(gen, vocab, size)
            sb = shingle_batch(texts, params.shingle_words, unique=False)
            sig = minhash_flat(sb.hashes, sb.offsets, params)
            index.add(ids, band_keys(sig, params))
            if store is not None:
                store.add_flat(ids, sb.hashes, sb.offsets)
            del texts, sb, sig
        result = cluster(index, n, verify=store.jaccard if store else None)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return {
            "docs": n,
            "baseline_rss_mb": base / 2**20,
            "peak_rss_mb": peak / 2**20,
            "bytes_per_doc": (peak - base) / n,
            "docs_per_s": n / seconds,
            "duplicates": result.duplicates,
            "edge_index_bytes_per_doc": index.disk_bytes() / n,
        }


def memory_mode(n: int, batch: int, verify: bool) -> None:
    rows = []
    for size in (n // 4, n):
        cmd = [sys.executable, __file__, "--memory-child", str(size), "--batch", str(batch)]
        if verify:
            cmd.append("--verify")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"memory, streaming batches of {batch} synthetic documents, verify={verify}")
    print(f"{'docs':>9} {'base MB':>9} {'peak MB':>9} {'B/doc':>8} {'docs/s':>9} {'dups':>7}")
    for r in rows:
        print(
            f"{r['docs']:>9} {r['baseline_rss_mb']:>9.1f} {r['peak_rss_mb']:>9.1f} "
            f"{r['bytes_per_doc']:>8.0f} {r['docs_per_s']:>9.0f} {r['duplicates']:>7}"
        )
    growth = (
        (rows[1]["peak_rss_mb"] - rows[0]["peak_rss_mb"])
        * 2**20
        / (rows[1]["docs"] - rows[0]["docs"])
    )
    print(f"marginal growth between N/4 and N: {growth:.0f} B/doc")


# ----------------------------------------------------------------------------- main


def speed_and_quality(args: argparse.Namespace) -> None:
    texts, planted = build_corpus(args)
    n = len(texts)
    words = sum(len(t.split()) for t in texts)
    print(f"corpus: {n} documents ({len(planted)} planted near-duplicates), {words} words")
    print(f"params: {json.dumps(PARAMS.to_dict())}")
    rows = []

    def best_of(run):  # the fastest of ``--repeat`` runs, for every pipeline alike
        best, out = float("inf"), None
        for rep in range(args.repeat):
            t0 = time.perf_counter()
            out = run(rep)
            best = min(best, time.perf_counter() - t0)
        return best, out

    with tempfile.TemporaryDirectory() as tmp:
        run_ledgerlm(texts[:200], PARAMS, Path(tmp) / "warm", args.batch, verify=True)
        for name, verify, per_doc in (
            ("ledgerlm", False, False),
            ("ledgerlm + verify", True, False),
            ("ledgerlm per-doc API", False, True),
        ):
            seconds, (labels, stats) = best_of(
                lambda rep, v=verify, d=per_doc: run_ledgerlm(
                    texts, PARAMS, Path(tmp) / f"{int(v)}{int(d)}-{rep}", args.batch, v, d
                )
            )
            rows.append((name, seconds, labels, stats))
    seconds, labels = best_of(lambda rep: run_datasketch(texts, PARAMS))
    rows.append(("datasketch", seconds, labels, {}))
    if args.per_shingle_sample:
        m = min(n, args.per_shingle_sample)
        t0 = time.perf_counter()
        run_datasketch(texts[:: max(1, n // m)][:m], PARAMS, per_shingle=True)
        per_shingle_rate = m / (time.perf_counter() - t0)
    truth = sample_truth(
        texts, planted, args.sample, PARAMS.shingle_words, np.random.default_rng(7)
    )
    ds_rate = n / rows[3][1]
    print()
    head = ("pipeline", "docs/s", "x datasketch", "dups", "precision", "recall")
    print("{:<20} {:>9} {:>13} {:>6} {:>10} {:>7}".format(*head))
    for name, seconds, labels, _ in rows:
        q = quality(labels, truth, PARAMS.threshold)
        dups = int(np.count_nonzero(labels != np.arange(n)))
        print(
            f"{name:<20} {n / seconds:>9.0f} {n / seconds / ds_rate:>13.1f} {dups:>6} "
            f"{q['precision']:>10.4f} {q['recall']:>7.4f}"
        )
    if args.per_shingle_sample:
        ratio = per_shingle_rate / ds_rate
        print(
            f"{'datasketch update()':<20} {per_shingle_rate:>9.0f} {ratio:>13.2f}"
            f"   (MinHash.update per shingle, every {max(1, n // m)}th document)"
        )
    q = quality(rows[0][2], truth, PARAMS.threshold)
    print()
    print(
        f"quality sample: {len(truth[0])} documents, {q['positives']} pairs with exact "
        f"Jaccard >= {PARAMS.threshold + 0.05:.2f} (recall), precision = pairs in one cluster "
        f"with Jaccard >= {PARAMS.threshold} / pairs in one cluster"
    )
    print(f"ledgerlm cluster stats: {json.dumps(rows[0][3])}")
    print(f"ledgerlm + verify stats: {json.dumps(rows[1][3])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--code-docs", type=int, default=2000)
    ap.add_argument("--docs-docs", type=int, default=400)
    ap.add_argument("--math-docs", type=int, default=5000)
    ap.add_argument("--dup-fraction", type=float, default=0.2, help="documents given a copy")
    ap.add_argument("--sample", type=int, default=1000, help="documents in the quality sample")
    ap.add_argument("--batch", type=int, default=10_000, help="documents per streamed batch")
    ap.add_argument("--repeat", type=int, default=2, help="timing runs per pipeline (best)")
    ap.add_argument(
        "--per-shingle-sample",
        type=int,
        default=300,
        help="also time datasketch MinHash.update per shingle on this many documents (0: no)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory", type=int, default=None, metavar="N", help="memory mode")
    ap.add_argument("--verify", action="store_true", help="memory mode: verify candidates")
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child is not None:
        print(json.dumps(memory_child(args.memory_child, args.batch, args.verify)))
    elif args.memory is not None:
        memory_mode(args.memory, args.batch, args.verify)
    else:
        speed_and_quality(args)


if __name__ == "__main__":
    main()
