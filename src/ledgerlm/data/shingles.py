"""The words of a normalized text, hashed, and their shingles and digests (requirement D4).

Near dedup (``minhash``), exact dedup (``word_digests``, the key the data stage groups by)
and contamination (n-grams of evaluation texts) read the same words, hashed the same way.

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
  A change to any hash here changes recorded signatures: it needs ``minhash.HASH_VERSION``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NORMALIZATION = "nfkc+casefold+collapse-whitespace"

_U64 = np.uint64
_GOLDEN = 0x9E3779B97F4A7C15

# Bytes of normalized text shingled at once; the temporaries cost about 30 B per byte.
_TEXT_CHUNK = 1 << 20
_MAX_CHUNK_DOCS = 1 << 16  # document indices of a chunk fit in uint16 for the radix sort


def normalize_text(text: str) -> str:
    """Two documents that differ only in Unicode form, case or spacing are the same.

    Whitespace runs become one space and the ends are stripped: ``" ".join(s.split())``
    splits where a regex's whitespace class would (both use ``str.isspace``), 10x faster.
    """
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


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


@functools.lru_cache(maxsize=64)
def _shingle_multipliers(k: int) -> np.ndarray:
    # Odd, so that every word of a shingle changes its hash; distinct per position, so order
    # matters ("a b" and "b a" differ).
    out = _constants(0x5EED_0005, k) | _U64(1)
    out.flags.writeable = False
    return out


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
    digest too (``word_digests``)."""
    return [_prenormalize(t) for t in texts]


def word_digests(texts: Sequence[str], normalized: bool = False) -> np.ndarray:
    """(documents, 2) uint64: a 128-bit digest of each text's normalized words (the words
    of ``normalize_text``), so two texts get the same digest exactly when their
    normalized forms are equal (up to a ~2^-64 chance). The exact-dedup key: hashing
    the words the shingles are made of is cheaper than rebuilding and hashing the
    normalized string."""
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
