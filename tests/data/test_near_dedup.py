"""Near-duplicate detection: S-curve tuning, shingling, MinHash, LSH and out-of-core clustering."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import combinations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerlm.config import NearDedupConfig
from ledgerlm.data import cluster as cluster_module
from ledgerlm.data import minhash as mh
from ledgerlm.data import shingles as sh
from ledgerlm.data.cluster import EdgeIndex, ShingleStore, UnionFind, cluster
from ledgerlm.data.lsh_tuning import fp_fn_integrals, optimal_bands_rows, s_curve
from ledgerlm.data.minhash import (
    PRESETS,
    LSHParams,
    band_keys,
    minhash_signatures,
    params_from_config,
)
from ledgerlm.data.shingles import normalize_text, shingle_batch, shingle_hashes

# ----------------------------------------------------------------------------- helpers


def vocabulary(size: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters, size=int(rng.integers(3, 11)))))
    return sorted(words)


def random_docs(n: int, vocab: list[str], rng: np.random.Generator) -> list[list[str]]:
    return [list(rng.choice(vocab, size=int(rng.integers(100, 301)))) for _ in range(n)]


def edit(words: list[str], fraction: float, vocab: list[str], rng: np.random.Generator) -> list:
    out = list(words)
    for i in rng.choice(len(out), size=max(1, round(fraction * len(out))), replace=False):
        out[i] = vocab[int(rng.integers(len(vocab)))]
    return out


def set_jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def kgram_sets(text: str, k: int) -> set[tuple[str, ...]]:
    words = normalize_text(text).split()
    if not words:
        return set()
    if len(words) < k:
        return {tuple(words)}
    return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}


def run_near_dedup(
    texts: list[str],
    params: LSHParams,
    tmp_path,
    verify: bool,
    batch: int = 64,
    order: np.ndarray | None = None,
):
    """The streaming pipeline: shingle -> signatures -> band keys -> edge index -> cluster."""
    index = EdgeIndex(tmp_path / "edges", params, partitions=4)
    store = ShingleStore(tmp_path / "shingles") if verify else None
    ids = np.arange(len(texts), dtype=np.int64)
    batches = [ids[i : i + batch] for i in range(0, len(texts), batch)]
    if order is not None:
        batches = [batches[i] for i in order]
    sigs = np.zeros((len(texts), params.num_perm), dtype=np.uint32)
    for doc_ids in batches:
        shingles = shingle_batch([texts[i] for i in doc_ids], params.shingle_words)
        sig = minhash_signatures(shingles.sets(), params)
        sigs[doc_ids] = sig
        index.add(doc_ids, band_keys(sig, params))
        if store is not None:
            store.add_flat(doc_ids, shingles.hashes, shingles.offsets)
    result = cluster(index, len(texts), verify=store.jaccard if store else None)
    return result, sigs


# ----------------------------------------------------------------------------- S-curve


def test_optimal_bands_rows_is_a_valid_split_and_follows_the_weight():
    b, r = optimal_bands_rows(0.8, 112)
    assert b >= 1 and r >= 1 and b * r <= 112
    precise = optimal_bands_rows(0.8, 112, fp_weight=0.9)
    recall = optimal_bands_rows(0.8, 112, fp_weight=0.1)
    fp_p, fn_p = fp_fn_integrals(0.8, *precise)
    fp_r, fn_r = fp_fn_integrals(0.8, *recall)
    assert fp_p[0] < fp_r[0]
    assert fn_r[0] < fn_p[0]
    # the balanced choice puts the steep part of the curve at the threshold
    assert 0.3 < s_curve(0.8, b, r) < 0.7


def test_integrals_match_a_fine_riemann_sum():
    s = np.linspace(0, 1, 400_001)
    p = s_curve(s, 14, 8)
    below = s <= 0.8
    fp, fn = fp_fn_integrals(0.8, 14, 8)
    assert fp[0] == pytest.approx(p[below].mean() * 0.8, abs=1e-4)
    assert fn[0] == pytest.approx((1 - p[~below]).mean() * 0.2, abs=1e-4)


def test_fineweb_s_curve():
    p = PRESETS["fineweb"]
    assert (p.shingle_words, p.bands, p.rows, p.num_perm) == (5, 14, 8, 112)
    at_08 = float(s_curve(0.8, p.bands, p.rows))
    at_05 = float(s_curve(0.5, p.bands, p.rows))
    assert 0.8 < at_08 < 1.0
    assert at_05 < 0.1
    assert at_08 == pytest.approx(0.9235, abs=1e-3)  # 1 - (1 - 0.8^8)^14
    assert at_05 == pytest.approx(0.0533, abs=1e-3)


def test_precise_preset_is_sharper_than_fineweb():
    f, p = PRESETS["fineweb"], PRESETS["precise"]
    assert (p.bands, p.rows) == optimal_bands_rows(0.8, 256, 0.5)
    assert s_curve(0.6, p.bands, p.rows) < s_curve(0.6, f.bands, f.rows) / 10
    assert s_curve(0.9, p.bands, p.rows) > 0.95


def test_params_from_config():
    assert params_from_config(NearDedupConfig()) == PRESETS["fineweb"]
    p = params_from_config(NearDedupConfig(preset="precise", shingle_words=3, seed=7))
    assert (p.shingle_words, p.bands, p.rows, p.seed) == (3, 17, 15, 7)
    p = params_from_config(NearDedupConfig(bands=20, rows=5, threshold=0.7))
    assert (p.bands, p.rows, p.threshold) == (20, 5, 0.7)
    p = params_from_config(NearDedupConfig(preset="custom", threshold=0.7, num_perm=64))
    assert (p.bands, p.rows) == optimal_bands_rows(0.7, 64, 0.5)
    with pytest.raises(ValueError):
        params_from_config(NearDedupConfig(bands=4))
    with pytest.raises(ValueError):
        params_from_config(NearDedupConfig(rows=4))
    assert p.to_dict()["num_perm"] == p.num_perm


# ----------------------------------------------------------------------------- shingles


def test_unicode_whitespace_list_is_complete():
    spaces = {chr(c) for c in range(128, 0x110000) if chr(c).isspace()}
    assert spaces == set(sh._UNICODE_SPACES)


@settings(max_examples=300, deadline=None)
@given(
    st.text(
        alphabet=st.one_of(
            st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u2003\u3000\u2028abcABCßİﬁ")),
            st.characters(),
        ),
        max_size=60,
    )
)
def test_prenormalize_gives_the_words_of_normalize_text(text):
    assert sh._prenormalize(text).split() == normalize_text(text).split()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=40), max_size=6), st.integers(1, 6))
def test_shingle_count_is_the_number_of_distinct_kgrams(texts, k):
    batch = shingle_batch(texts, k)
    for text, hashes in zip(texts, batch.sets(), strict=True):
        assert len(hashes) == len(kgram_sets(text, k))
        assert np.array_equal(hashes, shingle_hashes(text, k))  # batch == single
        assert hashes.dtype == np.uint64
        assert (np.diff(hashes) > 0).all()


def test_shingle_hash_edge_cases():
    assert len(shingle_hashes("", 5)) == 0
    assert len(shingle_hashes(" \n\t ", 5)) == 0
    assert len(shingle_hashes("two words", 5)) == 1
    assert not np.array_equal(shingle_hashes("two words", 5), shingle_hashes("words two", 5))
    assert np.array_equal(shingle_hashes("Hello  WORLD", 1), shingle_hashes("hello world", 1))
    # words of every length class: 8-byte chunks, a partial chunk, past 64 bytes
    stems = ["a" * n for n in (1, 7, 8, 9, 16, 17, 64, 65, 300)]
    seen = set()
    for stem in stems:
        for tail in ("x", "y"):
            seen.add(int(shingle_hashes(stem + tail, 1)[0]))
    assert len(seen) == 2 * len(stems)
    # a difference at byte 200 of a long word, or past position 256, still counts
    long_a, long_b = "q" * 200 + "a" + "q" * 99, "q" * 200 + "b" + "q" * 99
    assert shingle_hashes(long_a, 1)[0] != shingle_hashes(long_b, 1)[0]
    assert shingle_hashes("é ü 中文 😀", 2).size == 3


def test_shingles_are_the_same_in_every_process():
    code = (
        "from ledgerlm.data.minhash import *;"
        "from ledgerlm.data.shingles import shingle_hashes;"
        "import hashlib;"
        "s = shingle_hashes('the quick brown fox jumps over the lazy dog again', 3);"
        "g = minhash_signatures([s], PRESETS['fineweb']);"
        "k = band_keys(g, PRESETS['fineweb']);"
        "print(hashlib.sha256(s.tobytes() + g.tobytes() + k.tobytes()).hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    s = shingle_hashes("the quick brown fox jumps over the lazy dog again", 3)
    g = minhash_signatures([s], PRESETS["fineweb"])
    k = band_keys(g, PRESETS["fineweb"])
    import hashlib

    here = hashlib.sha256(s.tobytes() + g.tobytes() + k.tobytes()).hexdigest()
    assert out.stdout.strip() == here


def test_hashes_are_pinned():
    """Recorded datasets compare signatures across runs: a change here needs HASH_VERSION."""
    params = PRESETS["fineweb"]
    s = shingle_hashes("The quick brown fox jumps over the lazy dog", 5)
    assert s[:2].tolist() == [2866293612990902038, 8572682950340404232]
    sig = minhash_signatures([s], params)
    assert sig[0, :4].tolist() == [342413280, 711696983, 184311805, 595261968]
    assert band_keys(sig, params)[0, :2].tolist() == [1989632968742314511, 14958247851309840848]
    assert mh.HASH_VERSION == 1


def test_lone_surrogates_do_not_break_shingling():
    assert shingle_hashes("a \ud800 b", 1).size == 3


# ----------------------------------------------------------------------------- MinHash


def test_signatures_match_a_naive_computation_across_windows():
    params = LSHParams(shingle_words=5, bands=5, rows=7, threshold=0.8, seed=3)  # 2 blocks + 3
    rng = np.random.default_rng(0)
    window = mh._WINDOW
    sets = [
        rng.integers(0, 2**64, size=n, dtype=np.uint64) for n in (3, 0, 1, 2 * window + 5, 0, 40)
    ]
    sig = minhash_signatures(sets, params)
    assert sig.shape == (len(sets), 35) and sig.dtype == np.uint32
    a, b = mh.permutation_coefficients(params)
    for s, row in zip(sets, sig, strict=True):
        if len(s) == 0:
            assert (row == 0xFFFFFFFF).all()
            continue
        x = (s ^ (s >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
        naive = ((np.multiply.outer(x, a) + b) >> np.uint64(32)).min(axis=0)
        assert np.array_equal(row, naive.astype(np.uint32))


def test_minhash_estimates_jaccard_within_0_1():
    vocab = vocabulary(3000, seed=1)
    rng = np.random.default_rng(2)
    params = PRESETS["fineweb"]
    errors = []
    for fraction in np.linspace(0.0, 0.3, 16):
        base = random_docs(1, vocab, rng)[0]
        other = edit(base, float(fraction), vocab, rng) if fraction else list(base)
        a, b = shingle_hashes(" ".join(base), 5), shingle_hashes(" ".join(other), 5)
        exact = len(np.intersect1d(a, b)) / len(np.union1d(a, b))
        sig = minhash_signatures([a, b], params)
        errors.append(float(np.mean(sig[0] == sig[1])) - exact)
    errors = np.abs(errors)
    assert errors.max() <= 0.1, errors
    assert errors.mean() < 0.05


def test_repeats_and_order_do_not_change_signatures():
    texts = ["a b c a b c a b c d", "x y z " * 20, "", "one two"]
    params = PRESETS["fineweb"]
    sets = shingle_batch(texts, 3, unique=True)
    raw = shingle_batch(texts, 3, unique=False)
    assert raw.counts()[1] > sets.counts()[1]
    sig_sets = minhash_signatures(sets.sets(), params)
    assert np.array_equal(sig_sets, mh.minhash_flat(raw.hashes, raw.offsets, params))
    for a, b in zip(sets.sets(), raw.sets(), strict=True):
        assert np.array_equal(a, np.unique(b))


def test_band_keys_separate_bands_and_rows():
    params = LSHParams(shingle_words=5, bands=3, rows=4, threshold=0.8, seed=0)
    sig = np.zeros((2, 12), dtype=np.uint32)
    sig[1, 4:8] = 7  # only the second band differs
    keys = band_keys(sig, params)
    assert keys.shape == (2, 3) and keys.dtype == np.uint64
    assert len(set(keys[0].tolist())) == 3  # same values, different bands
    assert keys[0, 0] == keys[1, 0] and keys[0, 2] == keys[1, 2]
    assert keys[0, 1] != keys[1, 1]
    swapped = sig[:1].copy()
    swapped[0, 0], swapped[0, 1] = 1, 2
    other = sig[:1].copy()
    other[0, 0], other[0, 1] = 2, 1
    assert band_keys(swapped, params)[0, 0] != band_keys(other, params)[0, 0]


# ----------------------------------------------------------------------------- clustering


def naive_components(n: int, edges: list[tuple[int, int]]) -> list[int]:
    label = list(range(n))
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            m = min(label[a], label[b])
            if label[a] != m or label[b] != m:
                label[a] = label[b] = m
                changed = True
    return label


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(
                st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30),
                max_size=4,
            ),
        )
    )
)
def test_union_find_matches_naive_components(case):
    n, batches = case
    uf = UnionFind(n)
    for edges in batches:
        uf.union_edges(np.array(edges, dtype=np.int64).reshape(-1, 2))
        assert (uf.parent[uf.parent] == uf.parent).all()  # flat between calls
    everything = [e for batch in batches for e in batch]
    assert uf.roots().tolist() == naive_components(n, everything)


def test_union_find_handles_long_chains_and_large_inputs():
    n = 1_000_000
    rng = np.random.default_rng(0)
    chain = np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)[rng.permutation(n - 1)]
    uf = UnionFind(n)
    uf.union_edges(chain)
    assert (uf.roots() == 0).all()
    uf = UnionFind(n)
    uf.union_edges(rng.integers(0, n, size=(2_000_000, 2)))
    roots = uf.roots()
    assert (roots <= np.arange(n)).all() and (roots[roots] == roots).all()


@pytest.mark.parametrize("chunk_elems, read_gap", [(1 << 19, 512), (50, 0)])
def test_shingle_store_jaccard_equals_set_jaccard(tmp_path, monkeypatch, chunk_elems, read_gap):
    monkeypatch.setattr(cluster_module, "_JACCARD_ELEMS", chunk_elems)
    monkeypatch.setattr(cluster_module, "_READ_GAP", read_gap)
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 2**64, size=400, dtype=np.uint64)
    store = ShingleStore(tmp_path)
    sets: dict[int, set[int]] = {}
    next_id = 0
    for _ in range(4):
        ids, arrays = [], []
        for _ in range(int(rng.integers(1, 12))):
            next_id += int(rng.integers(1, 3))  # gaps: documents without shingles
            arr = rng.choice(pool, size=int(rng.integers(0, 60)))  # with repeats, unsorted
            ids.append(next_id)
            arrays.append(arr)
            sets[next_id] = set(arr.tolist())
        store.add(np.array(ids), arrays)
    docs = list(range(next_id + 3))
    pairs = np.array(list(combinations(docs, 2)) + [(d, d) for d in docs], dtype=np.int64)
    got = store.jaccard(pairs[:, 0], pairs[:, 1])
    want = [set_jaccard(sets.get(a, set()), sets.get(b, set())) for a, b in pairs]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert np.array_equal(store.get(next_id), np.array(sorted(sets[next_id]), dtype=np.uint64))
    with pytest.raises(ValueError):
        store.add(np.array([1, 1]), [pool[:3], pool[:2]])


def test_shingle_store_accepts_any_arrival_order(tmp_path):
    rng = np.random.default_rng(6)
    sets = [rng.integers(0, 50, size=int(rng.integers(0, 30))).astype(np.uint64) for _ in range(30)]
    store = ShingleStore(tmp_path)
    ids = rng.permutation(30)
    for part in np.array_split(ids, 5):
        store.add(part, [sets[i] for i in part])
    left, right = np.triu_indices(30, 1)
    want = [
        set_jaccard(set(sets[a].tolist()), set(sets[b].tolist()))
        for a, b in zip(left, right, strict=True)
    ]
    np.testing.assert_allclose(store.jaccard(left, right), want, rtol=0, atol=1e-12)


def test_candidate_edges_are_sorted_stars(tmp_path):
    params = LSHParams(shingle_words=5, bands=2, rows=1, threshold=0.8, seed=0)
    index = EdgeIndex(tmp_path, params, partitions=3)
    keys = np.array([[10, 20], [11, 20], [10, 21], [12, 20], [10, 22]], dtype=np.uint64)
    index.add(np.array([4, 3, 2, 1, 0]), keys)
    edges = np.concatenate(list(index.candidate_edges()))
    got = {tuple(e) for e in edges.tolist()}
    # key 10: docs {4, 2, 0} -> (0, 2), (0, 4); key 20: docs {4, 3, 1} -> (1, 3), (1, 4)
    assert got == {(0, 2), (0, 4), (1, 3), (1, 4)}
    result = cluster(index, 5)
    assert result.labels.tolist() == [0, 0, 0, 0, 0]
    assert result.candidate_edges == 4 and result.to_dict()["duplicates"] == 4


# ----------------------------------------------------------------------------- planted


@pytest.fixture(scope="module")
def planted():
    """300 distinct documents; 60 lightly edited copies (Jaccard about 0.9), 30 copies just
    below the threshold (about 0.7, many become LSH candidates) and 30 far below (<= 0.5)."""
    vocab = vocabulary(3000, seed=11)
    rng = np.random.default_rng(12)
    originals = random_docs(300, vocab, rng)
    docs = [list(d) for d in originals]
    for i in range(60):
        copy = edit(originals[i], 0.01, vocab, rng) + list(rng.choice(vocab, size=2))
        docs.append(copy)
    for i in range(60, 90):
        docs.append(edit(originals[i], 0.04, vocab, rng))
    for i in range(90, 120):
        docs.append(edit(originals[i], 0.12, vocab, rng))
    texts = [" ".join(d) for d in docs]
    order = np.random.default_rng(13).permutation(len(texts))
    texts = [texts[i] for i in order]  # copies are not always after their original
    shingles = [kgram_sets(t, 5) for t in texts]
    return texts, shingles


def test_planted_near_duplicates_are_found_and_nothing_else(planted, tmp_path):
    texts, shingles = planted
    result, _ = run_near_dedup(texts, PRESETS["fineweb"], tmp_path, verify=True)
    labels = result.labels
    high = low_together = found = 0
    high_sims = []
    for a, b in combinations(range(len(texts)), 2):
        if labels[a] != labels[b] and not (shingles[a] & shingles[b]):
            continue
        j = set_jaccard(shingles[a], shingles[b])
        if j >= 0.85:
            high += 1
            high_sims.append(j)
            found += labels[a] == labels[b]
        elif j < 0.8 and labels[a] == labels[b]:
            low_together += 1
    assert high >= 55  # the planted pairs are really there
    assert found / high >= 0.95
    assert low_together == 0
    assert result.verified_edges >= found
    assert result.rejected_edges > 0  # the copies near 0.7 were candidates, and refused
    # root = smallest document id of its cluster
    for root in np.unique(labels):
        assert root == np.flatnonzero(labels == root).min()


def test_without_verification_lsh_alone_is_still_close(planted, tmp_path):
    texts, _ = planted
    result, _ = run_near_dedup(texts, PRESETS["fineweb"], tmp_path, verify=False)
    assert result.verified_edges == 0 and result.rejected_edges == 0
    assert result.duplicates >= 55


def test_results_do_not_depend_on_run_or_arrival_order(planted, tmp_path):
    texts, _ = planted
    params = PRESETS["fineweb"]
    first, sig1 = run_near_dedup(texts, params, tmp_path / "a", verify=True)
    again, sig2 = run_near_dedup(texts, params, tmp_path / "b", verify=True)
    order = np.random.default_rng(3).permutation((len(texts) + 63) // 64)
    shuffled, sig3 = run_near_dedup(texts, params, tmp_path / "c", verify=True, order=order)
    small, _ = run_near_dedup(texts, params, tmp_path / "d", verify=True, batch=7)
    assert np.array_equal(sig1, sig2) and np.array_equal(sig1, sig3)
    assert np.array_equal(first.labels, again.labels)
    assert np.array_equal(first.labels, shuffled.labels)
    assert np.array_equal(first.labels, small.labels)
    assert first.to_dict() == again.to_dict() == shuffled.to_dict()
