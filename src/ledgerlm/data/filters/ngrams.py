"""Word n-gram kernels of the repetition filter: the share of a text's words that its
most frequent n-gram covers, one text at a time (``top_ngram_fraction``) or for a batch at
once with numpy (``top_ngram_fractions``, ``repeated_ngram_over``); and the evenly
spaced slices long texts are sampled in (``_windows``, which the script filter reads too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np


def _ngrams(words: list[bytes], n: int) -> Iterable[tuple[bytes, ...]]:
    return zip(*(words[i:] for i in range(n)), strict=False)


def _windows(text: str, max_chars: int, windows: int) -> list[str]:
    """Evenly spaced slices of a long text (the whole text when short).

    Contiguous slices, not random words, because n-grams need their neighbours.
    """
    if len(text) <= max_chars or windows < 2:
        return [text]
    size = max_chars // windows
    step = (len(text) - size) / (windows - 1)
    return [text[round(i * step) : round(i * step) + size] for i in range(windows)]


# ASCII punctuation becomes a word break; words are then whitespace-separated runs of the
# case-folded UTF-8 bytes. A byte-level split is ~3x faster than ``re.findall(r"\w+")``
# and, unlike ``str.translate``, stays fast on non-ASCII text.
_PUNCT = bytes(c for c in range(128) if not (chr(c).isalnum() or chr(c).isspace()))
_PUNCT_TO_SPACE = bytes.maketrans(_PUNCT, b" " * len(_PUNCT))


def _words(text: str) -> list[bytes]:
    return text.casefold().encode("utf-8", "surrogatepass").translate(_PUNCT_TO_SPACE).split()


def _self_overlaps(gram: tuple[bytes, ...]) -> bool:
    """Whether two occurrences of ``gram`` can overlap (e.g. "a a a", or "a b a")."""
    n = len(gram)
    return any(gram[k:] == gram[: n - k] for k in range(1, n))


def top_ngram_fraction(
    text: str, n: int = 3, min_words: int = 20, max_chars: int = 300_000, windows: int = 10
) -> float:
    """Share of word characters covered by the most frequent word n-gram (Gopher-style).

    Overlapping occurrences cover each word once, so "spam spam spam ..." gives ~1.0 rather
    than a multiple of it. Words are case-folded and split at whitespace and ASCII
    punctuation; their sizes are UTF-8 bytes, which for a text in one script is a fixed
    multiple of characters and so gives the same share. Fewer than ``min_words`` words
    give 0.0: a short text repeating one phrase twice is not spam.

    Texts over ``max_chars`` are estimated on ``windows`` evenly spaced slices (n-grams
    never cross a slice edge, and each slice's possibly cut first and last words are
    dropped). A spam pattern shows in every slice. For ordinary text the estimate errs
    high (the top n-gram of a sample is more concentrated than of the whole), but real
    prose sits around 0.01, far below any useful threshold.
    """
    parts = _windows(text, max_chars, windows)
    chunks = [_words(part) for part in parts]
    if len(parts) > 1:
        chunks = [words[1:-1] for words in chunks]
    if sum(map(len, chunks)) < max(min_words, n):
        return 0.0
    grams: Counter[tuple[bytes, ...]] = Counter()
    for chunk in chunks:
        grams.update(_ngrams(chunk, n))
    if not grams:
        return 0.0
    top, count = grams.most_common(1)[0]
    if count < 2:
        return 0.0
    total = sum(sum(map(len, chunk)) for chunk in chunks)
    if not _self_overlaps(top):  # occurrences are disjoint: no need to find them
        return count * sum(map(len, top)) / total
    covered = 0
    for chunk in chunks:
        starts = np.flatnonzero([g == top for g in _ngrams(chunk, n)])
        if starts.size:
            mask = np.zeros(len(chunk), dtype=bool)
            for j in range(n):
                mask[starts + j] = True
            lengths = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
            covered += int(lengths[mask].sum())
    return covered / total


_BATCH_BYTES = 1 << 20  # bytes of text scanned at once by ``top_ngram_fractions``


def top_ngram_fractions(
    texts: list[str],
    n: int = 3,
    min_words: int = 20,
    max_chars: int = 300_000,
    windows: int = 10,
    bound: bool = False,
) -> np.ndarray:
    """``top_ngram_fraction`` of every text, the same floats, for a batch at once.

    The Counter of n-gram tuples costs ~80 us per 1.5 KB document; here the words of a
    batch are hashed with numpy (``shingles.word_spans``: the words of ``_words``, 64-bit
    hashes), each n-gram becomes one 64-bit hash of its word hashes, and one sort by
    (document, n-gram) counts them all. The top n-gram of a document is its most frequent,
    ties going to the one seen first (as ``Counter.most_common``), and its share is
    computed from the same integers as ``top_ngram_fraction``. Equal hashes stand for equal
    words and n-grams (a false match needs a 64-bit collision). Texts over ``max_chars``
    (sampled in windows) take the one-text path. ``bound``: an upper bound of each share
    instead (see ``repeated_ngram_over``); long texts get their exact share.
    """
    out = np.zeros(len(texts), dtype=np.float64)
    short: list[int] = []
    for i, text in enumerate(texts):
        if len(text) > max_chars:
            out[i] = top_ngram_fraction(text, n, min_words, max_chars, windows)
        else:
            short.append(i)
    lo = 0
    while lo < len(short):
        size, hi = 0, lo
        while hi < len(short) and (size < _BATCH_BYTES or hi == lo):
            size += len(texts[short[hi]]) + 1
            hi += 1
        chunk = short[lo:hi]
        out[chunk] = _top_ngram_chunk([texts[i] for i in chunk], n, min_words, bound)
        lo = hi
    return out


def repeated_ngram_over(
    texts: list[str],
    threshold: float,
    n: int = 3,
    min_words: int = 20,
    max_chars: int = 300_000,
    windows: int = 10,
) -> np.ndarray:
    """``top_ngram_fraction(text) > threshold`` for every text, exactly, cheaply.

    First an upper bound per document without sorting: each n-gram is counted in a hash
    table of buckets (a bucket's count is at least the count of every n-gram in it), and
    the largest (bucket count x n-gram bytes) over a document's n-grams is at least the
    bytes its top n-gram covers. Only a document whose bound (as a share, rounded like the
    share itself) exceeds ``threshold`` gets its exact share (``top_ngram_fractions``);
    ordinary text is far below any useful threshold, so few do.
    """
    bounds = top_ngram_fractions(texts, n, min_words, max_chars, windows, bound=True)
    over = bounds > threshold
    check = np.flatnonzero(over)
    if check.size:
        exact = top_ngram_fractions([texts[i] for i in check], n, min_words, max_chars, windows)
        over[check] = exact > threshold
    return over


def _top_ngram_chunk(texts: list[str], n: int, min_words: int, bound: bool = False) -> np.ndarray:
    from ledgerlm.data.shingles import _fmix64, _shingle_multipliers, word_spans

    encoded = [
        t.casefold().encode("utf-8", "surrogatepass").translate(_PUNCT_TO_SPACE) for t in texts
    ]
    # the words of ``_words``: split at bytes.split's whitespace (and at the 0xFF between
    # documents, never a byte of UTF-8)
    words, starts, lengths = word_spans(b"\xff".join(encoded) + b"\xff" * 9, str_split=False)
    n_docs = len(texts)
    out = np.zeros(n_docs, dtype=np.float64)
    doc_start = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum([len(e) + 1 for e in encoded], out=doc_start[1:])
    first_word = np.searchsorted(starts, doc_start)  # words are in document order
    n_words = np.diff(first_word)
    doc = np.repeat(np.arange(n_docs), n_words)  # the document of every word
    # word bytes per document (float sums of integers, exact below 2**53)
    total = np.bincount(doc, weights=lengths, minlength=n_docs).astype(np.int64)
    # n-grams start at every word but the last n - 1 of a document that has enough words
    eligible = n_words >= max(min_words, n)
    grams_per_doc = np.where(eligible, n_words - n + 1, 0)
    if not grams_per_doc.sum():
        return out
    if bound:
        return _share_bounds(words, lengths, doc, first_word, n, eligible, total, out)
    gram_doc = np.repeat(np.arange(n_docs), grams_per_doc)
    at = np.arange(int(grams_per_doc.sum()), dtype=np.int64)
    at += np.repeat(first_word[:-1] - (np.cumsum(grams_per_doc) - grams_per_doc), grams_per_doc)
    mult = _shingle_multipliers(n)
    acc = words[at] * mult[0]
    for j in range(1, n):
        acc += words[at + j] * mult[j]
    gram = _fmix64(acc)
    # One sort of (document, n-gram) keys counts every n-gram of every document: the
    # document in the top bits, the n-gram hash in the rest (a false match inside one
    # document needs a collision of 64 - bits bits).
    bits = max(n_docs - 1, 1).bit_length()
    key = (gram_doc.astype(np.uint64) << np.uint64(64 - bits)) | (gram >> np.uint64(bits))
    ordered = np.sort(key)
    run_at = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    count = np.diff(np.append(run_at, len(ordered)))
    run_doc = (ordered[run_at] >> np.uint64(64 - bits)).astype(np.int64)
    doc_at = np.flatnonzero(np.r_[True, run_doc[1:] != run_doc[:-1]])
    best_of = np.zeros(n_docs, dtype=np.int64)  # highest count of each document
    best_of[run_doc[doc_at]] = np.maximum.reduceat(count, doc_at)
    # the top n-gram: of those with the highest count, the one seen first
    tied = ordered[run_at[(count == best_of[run_doc]) & (count >= 2)]]
    if not len(tied):
        return out
    slot = np.minimum(np.searchsorted(tied, key), len(tied) - 1)
    hit = np.flatnonzero(tied[slot] == key)  # n-grams (in text order) that are a top one
    hit_doc = gram_doc[hit]
    firsts = np.flatnonzero(np.r_[True, hit_doc[1:] != hit_doc[:-1]])
    docs, top = hit_doc[firsts], at[hit[firsts]]  # top: its first word
    best = best_of[docs]
    top_bytes = sum(lengths[top + j] for j in range(n))
    # occurrences can overlap ("a a a", "a b a") when a suffix of the n-gram is its prefix
    overlaps = np.zeros(len(docs), dtype=bool)
    for k in range(1, n):
        same = np.ones(len(docs), dtype=bool)
        for j in range(n - k):
            same &= words[top + k + j] == words[top + j]
        overlaps |= same
    share = (best * top_bytes) / total[docs]
    gram_start = np.cumsum(grams_per_doc) - grams_per_doc  # first n-gram of each document
    for i in np.flatnonzero(overlaps):  # rare: mark the words the occurrences cover
        dd = int(docs[i])
        w0, g0 = int(first_word[dd]), int(gram_start[dd])
        own = gram[g0 : g0 + int(grams_per_doc[dd])]  # n-gram k starts at word w0 + k
        hits = np.flatnonzero(own == own[int(top[i]) - w0])
        covered = np.zeros(int(n_words[dd]), dtype=bool)
        for j in range(n):
            covered[hits + j] = True
        w = lengths[w0 : w0 + int(n_words[dd])]
        share[i] = int(w[covered].sum()) / int(total[dd])
    out[docs] = share
    return out


def _share_bounds(
    words: np.ndarray,
    lengths: np.ndarray,
    doc: np.ndarray,
    first_word: np.ndarray,
    n: int,
    eligible: np.ndarray,
    total: np.ndarray,
    out: np.ndarray,
) -> np.ndarray:
    """Per document, max over its n-grams of (count of its bucket x its bytes) / word
    bytes: at least the top n-gram's share (``repeated_ngram_over``).

    The n-gram at every word comes from shifted slices (no gathers); those that run
    into the next document are counted too, which can only raise a bound. The same
    n-gram in two documents goes to two buckets (the document, times an odd constant,
    is added to its hash: distinct modulo the table size for every document).
    """
    from ledgerlm.data.shingles import _fmix64, _shingle_multipliers

    m = len(words)
    mult = _shingle_multipliers(n)
    padded = np.concatenate([words, np.zeros(n, dtype=np.uint64)])
    wide = np.concatenate([lengths, np.zeros(n, dtype=lengths.dtype)])
    gram = padded[:m] * mult[0]
    size_of = wide[:m].copy()
    for j in range(1, n):
        gram += padded[j : j + m] * mult[j]
        size_of += wide[j : j + m]
    gram += doc.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    size = 1 << max(int(m * 4 - 1).bit_length(), 4)  # 4+ buckets per n-gram
    bucket = (_fmix64(gram) & np.uint64(size - 1)).astype(np.intp)
    weight = np.bincount(bucket, minlength=size)[bucket] * size_of
    has = np.flatnonzero(eligible)
    out[has] = np.maximum.reduceat(weight, first_word[has]) / total[has]
    return out
