"""The batch paths of the filters and of the exact-dedup digest decide exactly what the
one-document paths decide: same shares, same drops, same groups of duplicates."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerlm.config import FiltersConfig
from ledgerlm.data.filters import build_filters
from ledgerlm.data.filters.ngrams import (
    repeated_ngram_over,
    top_ngram_fraction,
    top_ngram_fractions,
)
from ledgerlm.data.filters.repetition import RepetitionFilter
from ledgerlm.data.records import Document
from ledgerlm.data.shingles import normalize_text, shingles_and_digests, word_digests
from ledgerlm.data.steps import GroupStats, apply_filters_batch, group_of

WORDS = ["spam", "Spam", "eggs", "a", "b", "ß", "SS", "é", "e\u0301", "x" * 70, "1", "_"]
SEPARATORS = [" ", "  ", "\n", "\t", ", ", ".", "\u00a0", "\u2028", "\x1c", "!"]


def one_by_one(filters, doc: Document, stats: GroupStats) -> tuple[str, str] | None:
    """The chain as the recipe defines it: each filter's ``check`` in order, until one
    drops the document."""
    group = group_of(doc)
    for f in filters:
        stats.seen(f.name, doc, group)
        reason = f.check(doc)
        if reason is not None:
            stats.dropped(f.name, doc, reason, group)
            return f.name, reason
    return None


@st.composite
def texts(draw) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), max_size=90))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(words), max_size=len(words)))
    return "".join(w + s for w, s in zip(words, seps, strict=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(texts(), max_size=30), max_chars=st.sampled_from([40, 300_000]))
def test_batch_shares_are_the_one_text_shares(batch, max_chars):
    one = [top_ngram_fraction(t, 3, 20, max_chars, 4) for t in batch]
    assert top_ngram_fractions(batch, 3, 20, max_chars, 4).tolist() == one
    bounds = top_ngram_fractions(batch, 3, 20, max_chars, 4, bound=True)
    assert (bounds >= np.array(one)).all()
    for threshold in (0.0, 0.1, 0.3, 0.99):
        over = repeated_ngram_over(batch, threshold, 3, 20, max_chars, 4)
        assert over.tolist() == [share > threshold for share in one]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(texts(), max_size=30), data=st.data())
def test_batch_filtering_drops_and_counts_as_one_by_one(batch, data):
    cfg = FiltersConfig(
        min_chars=data.draw(st.integers(0, 30)),
        max_duplicate_line_fraction=data.draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])),
        max_top_ngram_fraction=data.draw(st.sampled_from([0.05, 0.2, 0.4, 1.0])),
        max_symbol_ratio=data.draw(st.sampled_from([0.1, 0.5, 1.0])),
    )
    docs = [Document(id=str(i), text=t, source="s", domain="web") for i, t in enumerate(batch)]
    filters = build_filters(cfg)
    one, many = GroupStats(), GroupStats()
    assert apply_filters_batch(filters, docs, many) == [one_by_one(filters, d, one) for d in docs]
    assert one == many
    rep = RepetitionFilter(cfg.max_duplicate_line_fraction, cfg.max_top_ngram_fraction)
    assert rep.check_batch(docs) == [rep.check(d) for d in docs]


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(texts(), max_size=40))
def test_word_digests_group_texts_as_their_normalized_text_does(batch):
    # some exact copies, and copies that differ in case only
    batch = batch + batch[: len(batch) // 2] + [t.swapcase() for t in batch[::3]]
    by_text: dict[str, set[int]] = {}
    by_words: dict[bytes, set[int]] = {}
    digests = word_digests(batch)
    for i, t in enumerate(batch):
        by_text.setdefault(normalize_text(t), set()).add(i)
        by_words.setdefault(digests[i].tobytes(), set()).add(i)
    assert sorted(map(sorted, by_text.values())) == sorted(map(sorted, by_words.values()))
    if batch:
        _, together = shingles_and_digests(batch, 5)
        assert (together == digests).all()
