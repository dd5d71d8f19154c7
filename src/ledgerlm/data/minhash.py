"""MinHash signatures and LSH band keys over word shingles, vectorized with numpy (requirement D4).

Shingles and their hashes come from ``shingles``; the choice of bands and rows from
``lsh_tuning``. Design choices, and why:

* Permutations are the multiply-add-shift family ``h(x) = ((a*x + b) mod 2**64) >> 32`` over
  the 32-bit fold of a shingle hash (Dietzfelbinger 1996). It is strongly universal for
  32-bit keys, like ``(a*x + b) mod p``, but ``mod 2**64`` is numpy's native wrap-around for
  uint64, so it needs neither division nor overflow care. Because the shift is monotone, the
  minimum is taken before shifting. Signatures are uint32.
* Work is done in windows of shingles x blocks of permutations with one preallocated 1 MB
  buffer, so memory is bounded by the window, not by the batch or the longest document.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ledgerlm.config import NearDedupConfig
from ledgerlm.data.lsh_tuning import optimal_bands_rows, s_curve
from ledgerlm.data.shingles import _GOLDEN, _constants, _exclusive_cumsum, _fmix64

_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)
_MAX32 = np.uint32(0xFFFFFFFF)

# Bump when any hash of ``shingles`` or below changes: recorded signatures and band keys
# stop being comparable.
HASH_VERSION = 1

# Shingles x permutations hashed at once: 1 MB of uint64, cache resident. Measured on
# AVX-512: 16 x 8192 runs at 0.63 ns per element, 112 x 2048 at 1.9 and 112 x 9362 at 1.1
# (numpy's integer loops are slow on short rows and memory bound on large buffers).
_WINDOW = 8192
_PERM_BLOCK = 16
_BAND_SALT = 0x5EED_0004


@dataclass(frozen=True)
class LSHParams:
    """Everything that decides which pairs become candidates; recorded with the dataset."""

    shingle_words: int
    bands: int
    rows: int
    threshold: float
    seed: int

    def __post_init__(self) -> None:
        if self.shingle_words < 1 or self.bands < 1 or self.rows < 1:
            raise ValueError(f"shingle_words, bands and rows must be >= 1: {self}")
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1): {self.threshold}")

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["num_perm"] = self.num_perm
        out["p_candidate_at_threshold"] = float(s_curve(self.threshold, self.bands, self.rows))
        out["shingle_hash"] = "words: 8-byte chunks chained by fmix64; shingles: linear+fmix64"
        out["permutations"] = "multiply-add-shift 64->32, coefficients default_rng(seed)"
        out["hash_version"] = HASH_VERSION
        return out


# --------------------------------------------------------------------------- presets


PRESETS: dict[str, LSHParams] = {
    # FineWeb's setting: 5-word shingles, 112 permutations as 14 bands x 8 rows. A pair at
    # Jaccard 0.8 becomes a candidate with p = 0.92, one at 0.5 with p = 0.054.
    "fineweb": LSHParams(shingle_words=5, bands=14, rows=8, threshold=0.8, seed=1),
    # A sharper S-curve centred on the threshold: 5-word shingles, 255 permutations as
    # 17 bands x 15 rows, which is ``optimal_bands_rows(0.8, 256, fp_weight=0.5)``.
    # p(candidate) is 0.008 at Jaccard 0.6, 0.08 at 0.7, 0.46 at 0.8, 0.79 at 0.85 and
    # 0.98 at 0.9 (fineweb: 0.21, 0.56, 0.92, 0.99, 1.0). Fineweb's curve sits low (its
    # midpoint is near 0.69) to favour recall and makes many candidates below 0.8; this one
    # makes 25x fewer at 0.6 (less to verify, fewer wrong merges without verification) and
    # still finds clear duplicates (>= 0.9), at 2.3x the MinHash cost.
    "precise": LSHParams(shingle_words=5, bands=17, rows=15, threshold=0.8, seed=1),
}


def params_from_config(cfg: NearDedupConfig) -> LSHParams:
    """The LSH parameters a config stands for.

    The threshold and seed always come from the config: the threshold is what the
    verification step treats as a duplicate, whatever curve chose the candidates.
    """
    if (cfg.bands is None) != (cfg.rows is None):
        raise ValueError("near_dedup: set both bands and rows, or neither")
    if cfg.preset == "custom":
        bands, rows = optimal_bands_rows(cfg.threshold, cfg.num_perm, cfg.fp_weight)
        shingle_words = PRESETS["fineweb"].shingle_words
    else:
        base = PRESETS[cfg.preset]
        bands, rows, shingle_words = base.bands, base.rows, base.shingle_words
    if cfg.bands is not None and cfg.rows is not None:
        bands, rows = cfg.bands, cfg.rows
    if cfg.shingle_words is not None:
        shingle_words = cfg.shingle_words
    return LSHParams(
        shingle_words=shingle_words,
        bands=bands,
        rows=rows,
        threshold=cfg.threshold,
        seed=cfg.seed,
    )


# --------------------------------------------------------------------------- MinHash


def permutation_coefficients(params: LSHParams) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of every permutation, each uint64 of length num_perm, from the seed alone."""
    rng = np.random.default_rng(params.seed)
    a = rng.integers(0, 2**64, size=params.num_perm, dtype=_U64, endpoint=False)
    b = rng.integers(0, 2**64, size=params.num_perm, dtype=_U64, endpoint=False)
    return a, b


def minhash_flat(hashes: np.ndarray, offsets: np.ndarray, params: LSHParams) -> np.ndarray:
    """Signatures (n_docs, num_perm) uint32 of documents laid out as in ``ShingleBatch``.

    The flat array is cut into fixed windows of shingles regardless of document boundaries
    (a document spanning windows takes the minimum of its pieces), and the permutations
    into blocks; one (block x window) buffer of 1 MB stays in cache while it is multiplied,
    offset and reduced, which measured 1.8x faster than one pass over all permutations.
    Memory is that buffer plus the output, even for a document of millions of shingles.
    A document without shingles keeps the all-0xFFFFFFFF signature.
    """
    hashes = np.asarray(hashes, dtype=_U64)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_docs = len(offsets) - 1
    a, b = permutation_coefficients(params)
    a = a[:, None]
    b = b[:, None]
    perm = params.num_perm
    sig = np.full((n_docs, perm), _MAX32, dtype=np.uint32)
    total = len(hashes)
    if total == 0:
        return sig
    keys = hashes ^ (hashes >> _U64(32))
    keys &= _MASK32
    buf = np.empty((_PERM_BLOCK, _WINDOW), dtype=_U64)
    mins = np.empty((perm, 0), dtype=_U64)
    doc_starts = offsets[:-1]
    for lo in range(0, total, _WINDOW):
        hi = min(lo + _WINDOW, total)
        # Documents with a shingle in [lo, hi): the one holding ``lo``, then those starting
        # inside. ``side="right"`` skips empty documents, which share the next one's start.
        first = int(np.searchsorted(offsets, lo, side="right")) - 1
        last = int(np.searchsorted(offsets, hi, side="left"))
        docs = np.arange(first, last)
        docs = docs[offsets[docs + 1] > offsets[docs]]
        cuts = np.maximum(doc_starts[docs], lo) - lo
        if mins.shape[1] != len(docs):
            mins = np.empty((perm, len(docs)), dtype=_U64)
        x = keys[None, lo:hi]
        for p in range(0, perm, _PERM_BLOCK):
            q = min(p + _PERM_BLOCK, perm)
            out = buf[: q - p, : hi - lo]
            np.multiply(a[p:q], x, out=out)
            out += b[p:q]
            np.minimum.reduceat(out, cuts, axis=1, out=mins[p:q])
        mins >>= _U64(32)
        piece = mins.T.astype(np.uint32)
        sig[docs] = np.minimum(sig[docs], piece)
    return sig


def minhash_signatures(shingle_sets: list[np.ndarray], params: LSHParams) -> np.ndarray:
    """MinHash signatures (len(shingle_sets), num_perm), dtype uint32; see ``minhash_flat``."""
    counts = np.fromiter((len(s) for s in shingle_sets), dtype=np.int64, count=len(shingle_sets))
    if len(shingle_sets):
        hashes = np.concatenate([np.asarray(s, dtype=_U64) for s in shingle_sets])
    else:
        hashes = np.zeros(0, dtype=_U64)
    return minhash_flat(hashes, _exclusive_cumsum(counts), params)


def band_keys(signatures: np.ndarray, params: LSHParams) -> np.ndarray:
    """One uint64 key per (document, band): equal keys mean equal rows in that band.

    Each band starts from its own salt, so equal values in different bands give different
    keys, and two documents share a key only by sharing the band (or by a 2^-64 accident).
    """
    sig = np.asarray(signatures)
    if sig.ndim != 2 or sig.shape[1] != params.num_perm:
        raise ValueError(f"signatures must be (n, {params.num_perm}); got {sig.shape}")
    n = sig.shape[0]
    cube = sig.reshape(n, params.bands, params.rows).astype(_U64)
    salt = (params.seed * 0x100000001B3 + _BAND_SALT) & 0xFFFFFFFFFFFFFFFF
    h = np.broadcast_to(_constants(salt, params.bands), (n, params.bands)).copy()
    for j in range(0, params.rows, 2):
        word = cube[:, :, j].copy()
        if j + 1 < params.rows:
            word |= cube[:, :, j + 1] << _U64(32)
        h *= _U64(_GOLDEN)
        h ^= word
        h = _fmix64(h)
    return h
