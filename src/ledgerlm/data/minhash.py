"""MinHash signatures and LSH band keys over word shingles, vectorized with numpy (SPEC D4).

Design choices, and why:

* Shingles are hashed without building shingle strings. The normalized texts of a batch are
  encoded once and scanned as bytes; each word is read 8 bytes at a time through an
  unaligned uint64 view and its chunks are chained through a 64-bit mixer (words over 64
  bytes get a tabulation hash instead), and a shingle of ``k`` words is a mixed linear
  combination of its word hashes. So the cost is a few array operations per byte and per
  word, with no Python object per word or shingle: building and hashing one Python string
  per shingle (what datasketch users do) costs more than the whole MinHash.
* Every constant comes from a fixed integer mixer, never from Python's salted ``hash()`` and
  never from host byte order, so the same text gives the same hashes on every machine.
* Permutations are the multiply-add-shift family ``h(x) = ((a*x + b) mod 2**64) >> 32`` over
  the 32-bit fold of a shingle hash (Dietzfelbinger 1996). It is strongly universal for
  32-bit keys, like ``(a*x + b) mod p``, but ``mod 2**64`` is numpy's native wrap-around for
  uint64, so it needs neither division nor overflow care. Because the shift is monotone, the
  minimum is taken before shifting. Signatures are uint32.
* Work is done in windows of shingles x blocks of permutations with one preallocated 1 MB
  buffer, so memory is bounded by the window, not by the batch or the longest document.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ledgerlm.config import NearDedupConfig
from ledgerlm.data.dedup import normalize_text

_U64 = np.uint64
_MASK32 = _U64(0xFFFFFFFF)
_MAX32 = np.uint32(0xFFFFFFFF)
_GOLDEN = 0x9E3779B97F4A7C15

# Bump when any hash below changes: recorded signatures and band keys stop being comparable.
HASH_VERSION = 1

# Shingles x permutations hashed at once: 1 MB of uint64, cache resident. Measured on
# AVX-512: 16 x 8192 runs at 0.63 ns per element, 112 x 2048 at 1.9 and 112 x 9362 at 1.1
# (numpy's integer loops are slow on short rows and memory bound on large buffers).
_WINDOW = 8192
_PERM_BLOCK = 16
# Bytes of normalized text shingled at once; the temporaries cost about 30 B per byte.
_TEXT_CHUNK = 1 << 20
_MAX_CHUNK_DOCS = 1 << 16  # document indices of a chunk fit in uint16 for the radix sort


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, in place: a bijection that spreads every input bit."""
    h ^= h >> _U64(33)
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


def _constants(salt: int, n: int) -> np.ndarray:
    """``n`` fixed pseudo-random uint64 values (a golden-ratio sequence through fmix64),
    identical on every platform and numpy version."""
    with np.errstate(over="ignore"):
        x = np.arange(1, n + 1, dtype=_U64) * _U64(_GOLDEN) + _U64(salt & 0xFFFFFFFFFFFFFFFF)
    return _fmix64(x)


# Tabulation table for long words: one random 64-bit value per (position in the word mod
# 256, byte value).
_BYTE_TABLE = _constants(0x5EED_0001, 256 * 256)
_WORD_LEN_SALT = _constants(0x5EED_0002, 1)[0]
_SHINGLE_LEN_SALT = _constants(0x5EED_0003, 1)[0]
_BAND_SALT = 0x5EED_0004


@functools.lru_cache(maxsize=64)
def _shingle_multipliers(k: int) -> np.ndarray:
    # Odd, so that every word of a shingle changes its hash; distinct per position, so order
    # matters ("a b" and "b a" differ).
    out = _constants(0x5EED_0005, k) | _U64(1)
    out.flags.writeable = False
    return out


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


# --------------------------------------------------------------------------- S-curve tuning


def s_curve(s: float | np.ndarray, bands: int, rows: int) -> np.ndarray:
    """P(two documents of Jaccard ``s`` share a band) = 1 - (1 - s^r)^b.

    Written as ``-expm1(b * log1p(-s^r))`` so that tiny probabilities keep their precision
    where the direct form would round to 0.
    """
    s = np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return -np.expm1(bands * np.log1p(-(s**rows)))


def _simpson(y: np.ndarray, a: float, b: float) -> np.ndarray:
    """Composite Simpson's rule along the last axis (an odd number of equally spaced points)."""
    n = y.shape[-1] - 1
    if n < 2 or n % 2:
        raise ValueError("Simpson's rule needs an even number of intervals")
    w = np.ones(n + 1)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return (y @ w) * (b - a) / (3.0 * n)


def fp_fn_integrals(
    threshold: float, bands: np.ndarray | int, rows: np.ndarray | int, intervals: int = 512
) -> tuple[np.ndarray, np.ndarray]:
    """Areas of false positives (below the threshold) and false negatives (above it).

    FP = integral over [0, t] of P(candidate | s); FN = integral over [t, 1] of
    1 - P(candidate | s). Each side has its own grid, so the kink at ``t`` is a grid point.
    """
    b = np.atleast_1d(np.asarray(bands, dtype=np.float64))[:, None]
    r = np.atleast_1d(np.asarray(rows, dtype=np.float64))[:, None]
    lo = np.linspace(0.0, threshold, intervals + 1)[None, :]
    hi = np.linspace(threshold, 1.0, intervals + 1)[None, :]
    with np.errstate(divide="ignore"):
        p_lo = -np.expm1(b * np.log1p(-(lo**r)))
        p_hi = -np.expm1(b * np.log1p(-(hi**r)))
    return _simpson(p_lo, 0.0, threshold), _simpson(1.0 - p_hi, threshold, 1.0)


def optimal_bands_rows(threshold: float, num_perm: int, fp_weight: float = 0.5) -> tuple[int, int]:
    """The (bands, rows) with bands*rows <= num_perm minimizing the weighted FP + FN areas.

    A heavier ``fp_weight`` buys precision (fewer pairs to verify) with recall. Ties go to
    the first candidate in (bands, rows) order, so the answer is deterministic.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1): {threshold}")
    if num_perm < 1:
        raise ValueError(f"num_perm must be >= 1: {num_perm}")
    if not 0.0 <= fp_weight <= 1.0:
        raise ValueError(f"fp_weight must be in [0, 1]: {fp_weight}")
    cand_b: list[int] = []
    cand_r: list[int] = []
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            cand_b.append(b)
            cand_r.append(r)
    bs = np.asarray(cand_b)
    rs = np.asarray(cand_r)
    errors = np.empty(len(bs))
    step = 4096  # bounds the (candidates x grid) matrix for large num_perm
    for i in range(0, len(bs), step):
        fp, fn = fp_fn_integrals(threshold, bs[i : i + step], rs[i : i + step])
        errors[i : i + step] = fp_weight * fp + (1.0 - fp_weight) * fn
    best = int(np.argmin(errors))
    return int(bs[best]), int(rs[best])


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


# --------------------------------------------------------------------------- shingling


@dataclass(frozen=True)
class ShingleBatch:
    """Shingle hashes of many documents as one flat array; doc ``i`` is
    ``hashes[offsets[i]:offsets[i + 1]]``. A flat layout costs no Python object per
    document, which matters at millions of documents."""

    hashes: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len(docs) + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sets(self) -> list[np.ndarray]:
        return np.split(self.hashes, self.offsets[1:-1]) if len(self) else []


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


# Whitespace to str.split() and to the ``\s`` of ``normalize_text``, beyond ASCII's
# 9-13, 28-31 and 32. Texts holding one of these (rare) take the slower exact path.
_UNICODE_SPACES = (
    "\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_UNICODE_SPACE_RE = re.compile(f"[{_UNICODE_SPACES}]")
_DOC_SEP = 0xFF  # never a byte of UTF-8, so it cannot occur inside a document
_LONG_WORD = 64  # bytes; longer words are hashed byte by byte instead of 8 at a time
_ALL_ONES = _U64(0xFFFFFFFFFFFFFFFF)


def _prenormalize(text: str) -> str:
    """``normalize_text`` up to whitespace: the same words, separated by ASCII whitespace.

    The regex that collapses whitespace costs most of ``normalize_text``; the byte scanner
    splits on ASCII whitespace itself, so only texts with non-ASCII spaces need it.
    """
    out = unicodedata.normalize("NFKC", text).casefold()
    if not out.isascii() and _UNICODE_SPACE_RE.search(out):
        return normalize_text(text)
    return out


def _long_word_hashes(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Tabulation hashes of words too long to read 8 bytes at a time.

    Costs some 10 array operations per byte, but only the rare words over ``_LONG_WORD``
    bytes (URLs, base64, minified code) come here, so no document can make the 8-byte loop
    run thousands of rounds.
    """
    first = _exclusive_cumsum(lengths)
    pos = np.arange(int(first[-1]), dtype=np.intp)
    pos -= np.repeat(first[:-1], lengths)
    idx = pos + np.repeat(starts, lengths)
    pos &= 255
    pos <<= 8
    pos |= buf[idx]
    words = np.add.reduceat(_BYTE_TABLE[pos], first[:-1])
    words ^= lengths.astype(_U64) * _WORD_LEN_SALT
    return _fmix64(words)


def word_spans(data: bytes, str_split: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word hashes, word start offsets, word lengths in bytes) of UTF-8 text whose
    documents end with 0xFF (see ``_word_hashes``)."""
    words, starts, lengths = _word_hashes(data, str_split, with_lengths=True)
    return words, starts, lengths


def _word_hashes(data: bytes, str_split: bool = True, with_lengths: bool = False) -> Any:
    """(word hashes, word start offsets) of UTF-8 text whose documents end with 0xFF.

    A word is read 8 bytes at a time through an unaligned little-endian uint64 view of the
    buffer, the bytes past its end masked off, and the chunks chained through a 64-bit
    mixer. That is a handful of operations per *word*, where a per-byte scan would cost
    them per byte. ``data`` must carry 8 bytes of padding after the last document.
    Words are split at the ASCII whitespace of ``str.split`` (``str_split``: \\x1c-\\x1f
    included) or of ``bytes.split`` (not), and at 0xFF; a word's hash does not depend on it.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    size = len(buf) - 8
    body = buf[:size]
    sep = np.empty(size + 1, dtype=bool)
    sep[0] = True  # a virtual separator before the first byte
    rest = sep[1:]
    np.less(body - np.uint8(9), 5, out=rest)  # \t \n \v \f \r
    if str_split:
        rest |= (body - np.uint8(28)) < 5  # \x1c-\x1f and space
    else:
        rest |= body == 32
    rest |= body == _DOC_SEP
    # The buffer starts (virtually) and ends with a separator, so the changes of state
    # alternate: word start, word end, start, end...
    flips = np.flatnonzero(sep[1:] != sep[:-1])
    starts = flips[0::2]
    lengths = flips[1::2] - starts
    if len(starts) == 0:
        return (np.zeros(0, dtype=_U64), starts, lengths)[: 3 if with_lengths else 2]
    view = np.ndarray(shape=(size + 1,), dtype="<u8", buffer=data, strides=(1,))
    mult = _U64(_GOLDEN)
    # Round one, over every word at once: the first 8 bytes, masked to the word.
    words = lengths.astype(_U64) * _WORD_LEN_SALT
    chunk = view[starts]
    chunk &= _ALL_ONES >> (64 - 8 * np.minimum(lengths, 8)).astype(_U64)
    words ^= chunk
    words *= mult
    words = _fmix64(words)
    # Later rounds, for the few longer words, grouped by their number of chunks (a radix
    # sort of small integers) so that each group runs on dense arrays.
    longer = np.flatnonzero((lengths > 8) & (lengths <= _LONG_WORD))
    if len(longer):
        chunks = ((lengths[longer] + 7) >> 3).astype(np.uint8)
        order = np.argsort(chunks, kind="stable")
        bounds = np.searchsorted(chunks[order], np.arange(2, _LONG_WORD // 8 + 2))
        for c in range(2, _LONG_WORD // 8 + 1):
            group = longer[order[bounds[c - 2] : bounds[c - 1]]]
            if len(group) == 0:
                continue
            at = starts[group]
            h = words[group]
            for j in range(1, c):
                chunk = view[at + 8 * j]
                if j == c - 1:  # the last chunk: keep only the word's own bytes
                    chunk &= _ALL_ONES >> (64 - 8 * (lengths[group] - 8 * j)).astype(_U64)
                h ^= chunk
                h *= mult
                h = _fmix64(h)
            words[group] = h
    long_ = np.flatnonzero(lengths > _LONG_WORD)
    if len(long_):
        words[long_] = _long_word_hashes(buf, starts[long_], lengths[long_])
    if with_lengths:
        return words, starts, lengths
    return words, starts


_DIGEST_SALTS = _constants(0x5EED_0006, 6)


def _sequence_digests(words: np.ndarray, n_words: np.ndarray) -> np.ndarray:
    """(documents, 2) uint64: two 64-bit hashes of each document's word sequence.

    Each word hash is bound to its position (xor a salted position, then fmix64), the
    document's are summed, and the sum is mixed with the word count. Equal sequences
    give equal digests; unequal ones collide with probability ~2^-64 per column.
    """
    out = np.zeros((len(n_words), 2), dtype=_U64)
    has = np.flatnonzero(n_words)
    if len(words):
        start = _exclusive_cumsum(n_words)[:-1]
        pos = np.arange(len(words), dtype=_U64)
        pos -= np.repeat(start, n_words).astype(_U64)
        for j in range(2):
            h = pos * _DIGEST_SALTS[2 * j]
            h += _DIGEST_SALTS[2 * j + 1]
            h ^= words
            out[has, j] = np.add.reduceat(_fmix64(h), start[has])
    for j in range(2):
        out[:, j] ^= n_words.astype(_U64) * _DIGEST_SALTS[4 + j]
        out[:, j] = _fmix64(out[:, j])
    return out


def _shingles_of_chunk(
    norms: Sequence[str], k: int, unique: bool, digests: list[np.ndarray] | None = None
) -> ShingleBatch:
    encoded = [t.encode("utf-8", "surrogatepass") for t in norms]
    words, word_at = _word_hashes(b"\xff".join(encoded) + b"\xff" * 9)
    n_docs = len(norms)
    sizes = np.fromiter((len(e) + 1 for e in encoded), dtype=np.int64, count=n_docs)
    # Words are in document order: count them per document with one search per document.
    n_words = np.diff(np.searchsorted(word_at, _exclusive_cumsum(sizes)))
    if digests is not None:
        digests.append(_sequence_digests(words, n_words))
        if k == 0:  # digests only
            return ShingleBatch(np.zeros(0, dtype=_U64), np.zeros(n_docs + 1, dtype=np.int64))
    per_doc = np.where(n_words >= k, n_words - k + 1, np.minimum(n_words, 1))
    offsets = _exclusive_cumsum(per_doc)
    total = int(offsets[-1])
    if total == 0:
        return ShingleBatch(np.zeros(0, dtype=_U64), offsets)
    word_start = _exclusive_cumsum(n_words)[:-1]
    mult = _shingle_multipliers(k)
    # The shingle starting at every word, from shifted slices (no gathers); words near a
    # document's end mix in the next document, but only full shingles are picked below.
    padded = np.concatenate([words, np.zeros(k, dtype=_U64)])
    at_word = padded[: len(words)] * mult[0]
    for i in range(1, k):
        at_word += padded[i : i + len(words)] * mult[i]
    at_word += _U64((k * int(_SHINGLE_LEN_SALT)) & 0xFFFFFFFFFFFFFFFF)
    start = np.arange(total, dtype=np.int64)
    start += np.repeat(word_start - offsets[:-1], per_doc)
    acc = at_word[start]
    short_docs = np.flatnonzero((n_words > 0) & (n_words < k))
    if len(short_docs):  # one shingle of all their words, fewer than k
        n_short = n_words[short_docs]
        first = word_start[short_docs]
        part = n_short.astype(_U64) * _SHINGLE_LEN_SALT
        for i in range(k - 1):
            part += np.where(i < n_short, padded[first + i] * mult[i], _U64(0))
        acc[offsets[short_docs]] = part
    acc = _fmix64(acc)
    if unique and n_docs == 1:
        acc = np.unique(acc)
        offsets = np.array([0, len(acc)], dtype=np.int64)
    elif unique:
        # Sort by hash, then stably by document: a radix sort when ids fit 16 bits,
        # several times faster than np.lexsort.
        order = np.argsort(acc)
        doc = np.repeat(np.arange(n_docs, dtype=np.int64), per_doc)[order]
        small = doc.astype(np.uint16) if n_docs <= 1 << 16 else doc
        order = order[np.argsort(small, kind="stable")]
        acc = acc[order]
        doc = np.repeat(np.arange(n_docs, dtype=np.int64), per_doc)
        keep = np.ones(total, dtype=bool)
        keep[1:] = (acc[1:] != acc[:-1]) | (doc[1:] != doc[:-1])
        acc = acc[keep]
        offsets = _exclusive_cumsum(np.bincount(doc[keep], minlength=n_docs))
    return ShingleBatch(acc, offsets)


def prenormalize(texts: Sequence[str]) -> list[str]:
    """What ``shingle_batch`` shingles: the texts case-folded and NFKC-normalized (their
    words are those of ``normalize_text``). Computed once, it serves the exact-dedup
    digest too (``dedup.normalized_digest``)."""
    return [_prenormalize(t) for t in texts]


def word_digests(texts: Sequence[str], normalized: bool = False) -> np.ndarray:
    """(documents, 2) uint64: a 128-bit digest of each text's normalized words (the words
    of ``normalize_text``), so two texts get the same digest exactly when their
    normalized forms are equal (up to a ~2^-64 chance). The exact-dedup key: hashing
    the words the shingles are made of is cheaper than rebuilding and hashing the
    normalized string (``dedup.text_digest``)."""
    out: list[np.ndarray] = []
    _chunked(texts, 0, True, normalized, out)
    return np.concatenate(out) if out else np.zeros((0, 2), dtype=_U64)


def shingles_and_digests(
    texts: Sequence[str], k: int, unique: bool = True, normalized: bool = False
) -> tuple[ShingleBatch, np.ndarray]:
    """``shingle_batch`` and ``word_digests`` of the same texts, from one word scan."""
    if k < 1:
        raise ValueError(f"shingle size must be >= 1: {k}")
    out: list[np.ndarray] = []
    batch = _chunked(texts, k, unique, normalized, out)
    return batch, (np.concatenate(out) if out else np.zeros((0, 2), dtype=_U64))


def shingle_batch(
    texts: Sequence[str], k: int, unique: bool = True, normalized: bool = False
) -> ShingleBatch:
    """Shingle hashes of many documents at once (the fast path; ``shingle_hashes`` is one).

    With ``unique`` each document's hashes are sorted and distinct (a set, as exact Jaccard
    needs); without it they keep text order and repeats, which MinHash does not mind.
    Memory is bounded by ``_TEXT_CHUNK`` bytes of text, whatever the batch size.
    ``normalized``: the texts are already ``prenormalize``'s output.
    """
    if k < 1:
        raise ValueError(f"shingle size must be >= 1: {k}")
    return _chunked(texts, k, unique, normalized, None)


def _chunked(
    texts: Sequence[str],
    k: int,
    unique: bool,
    normalized: bool,
    digests: list[np.ndarray] | None,
) -> ShingleBatch:
    norms = list(texts) if normalized else prenormalize(texts)
    parts: list[ShingleBatch] = []
    lo = 0
    size = 0
    for i, norm in enumerate(norms):
        size += len(norm) + 1
        if size >= _TEXT_CHUNK or i - lo + 1 >= _MAX_CHUNK_DOCS or i == len(norms) - 1:
            parts.append(_shingles_of_chunk(norms[lo : i + 1], k, unique, digests))
            lo, size = i + 1, 0
    if not parts:
        return ShingleBatch(np.zeros(0, dtype=_U64), np.zeros(1, dtype=np.int64))
    if len(parts) == 1:
        return parts[0]
    hashes = np.concatenate([p.hashes for p in parts])
    counts = np.concatenate([p.counts() for p in parts])
    return ShingleBatch(hashes, _exclusive_cumsum(counts))


def shingle_hashes(text: str, k: int) -> np.ndarray:
    """Sorted distinct uint64 hashes of the word ``k``-grams of ``normalize_text(text)``.

    A document of fewer than ``k`` words is one shingle of all its words, so short documents
    still have a signature; an empty document has no shingles.
    """
    return shingle_batch([text], k).hashes


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
