"""Requirement D3: document filters drop with a reason, and per-group counts add up and merge."""

from __future__ import annotations

import json
import pickle
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerlm.config import FiltersConfig
from ledgerlm.data.filters import build_filters
from ledgerlm.data.filters.length import LengthFilter
from ledgerlm.data.filters.ngrams import top_ngram_fraction
from ledgerlm.data.filters.repetition import RepetitionFilter, duplicate_line_fraction
from ledgerlm.data.filters.script import ScriptFilter, dominant_script
from ledgerlm.data.filters.symbols import SymbolRatioFilter, symbol_ratio
from ledgerlm.data.records import Document
from ledgerlm.data.steps import (
    Filter,
    GroupStats,
    apply_filters_batch,
    date_bucket,
    group_of,
    length_bucket,
)

PARAGRAPH = (
    "The committee met on Tuesday to review the budget for the coming year.\n"
    "Several members argued that the library deserved more funding, since visits\n"
    "had doubled after the new reading room opened. Others preferred to repair the\n"
    "roads first. After a long discussion, they agreed to split the surplus evenly\n"
    "and to revisit the question in the spring, once the winter costs were known."
)


def doc(text: str, domain: str = "web", **kw: str | None) -> Document:
    return Document(id=kw.pop("id", None) or "d", text=text, source="s", domain=domain, **kw)


def test_every_filter_keeps_a_normal_english_paragraph():
    filters = build_filters(FiltersConfig(scripts=["latin"]))
    assert [f.name for f in filters] == ["length", "repetition", "symbols", "script"]
    for f in filters:
        assert isinstance(f, Filter)
        assert f.check(doc(PARAGRAPH)) is None, f.name
        json.dumps(f.params(), allow_nan=False)


def test_script_filter_only_when_scripts_are_configured():
    assert [f.name for f in build_filters(FiltersConfig())] == ["length", "repetition", "symbols"]


@pytest.mark.parametrize(
    ("flt", "text", "reason"),
    [
        (LengthFilter(20, 1000), "too little", "too_short"),
        (LengthFilter(20, 1000), " \n\n   \t\n" * 10, "too_short"),
        (LengthFilter(20, 1000), PARAGRAPH * 3, "too_long"),
        (RepetitionFilter(0.5, 0.4), "Click here to subscribe now!\n" * 30, "duplicate_lines"),
        (RepetitionFilter(0.5, 0.4), "spam " * 200, "repeated_ngram"),
        (RepetitionFilter(0.5, 0.4), "buy cheap pills online, " * 40, "repeated_ngram"),
        (SymbolRatioFilter(0.5), "#$%^&*()!@#$%^&*{}[]|\\<>?~`" * 5, "symbols"),
        (
            ScriptFilter(["latin"]),
            "Привет, мир! Это обычный русский текст о погоде.",
            "script:cyrillic",
        ),
    ],
)
def test_each_filter_drops_its_bad_document_with_the_reason(flt, text, reason):
    assert flt.check(doc(PARAGRAPH)) is None
    assert flt.check(doc(text)) == reason


def test_excluded_domain_passes_the_symbol_filter():
    code = "x[i] = {k: (v ** 2) % m for k, v in d.items()} # -> {}\n" * 3 + "}}]);\n"
    f = SymbolRatioFilter(0.3, exclude_domains=["code"])
    assert f.check(doc(code, domain="web")) == "symbols"
    assert f.check(doc(code, domain="code")) is None


def test_short_documents_are_not_judged_as_ngram_spam():
    # fewer than 20 words: one repeated phrase is not evidence of spam
    assert top_ngram_fraction("thank you thank you thank you") == 0.0
    assert RepetitionFilter(0.5, 0.4).check(doc("thank you thank you thank you")) is None


def test_repetition_statistics():
    assert duplicate_line_fraction("a line\nanother line\n\n\n") == 0.0
    # copies after the first count, blank lines do not
    assert duplicate_line_fraction("abcd\nabcd\n\nwxyz\nwxyz\n") == pytest.approx(0.5)
    assert duplicate_line_fraction("") == 0.0
    # overlapping occurrences cover each word once
    assert top_ngram_fraction("spam " * 100) == pytest.approx(1.0)
    assert top_ngram_fraction("a b a " * 30) == pytest.approx(1.0)
    assert top_ngram_fraction("buy now cheap pills " * 30) == pytest.approx(11 / 16)
    assert top_ngram_fraction(PARAGRAPH) == 0.0


def test_long_documents_are_sampled_and_still_judged():
    rng = random.Random(0)
    vocab = [f"word{i}" for i in range(5000)]
    prose = " ".join(rng.choice(vocab) for _ in range(200_000))  # ~1.7M chars, sampled
    assert len(prose) > 300_000
    assert top_ngram_fraction(prose) < 0.01
    assert top_ngram_fraction("spam " * 400_000) == pytest.approx(1.0)
    half = prose[: len(prose) // 2] + " " + "free money now " * 60_000
    assert top_ngram_fraction(half) > 0.3
    assert dominant_script("Привет мир " * 100_000 + "hello") == "cyrillic"


@pytest.mark.parametrize(
    ("text", "script"),
    [
        (PARAGRAPH, "latin"),
        ("Ça m'étonne, où est la gare ?", "latin"),
        ("Ｆｕｌｌｗｉｄｔｈ", "latin"),
        ("Привет, мир!", "cyrillic"),
        ("Καλημέρα κόσμε", "greek"),
        ("مرحبا بالعالم", "arabic"),
        ("שלום עולם", "hebrew"),
        ("日本語のテキストです", "cjk"),
        ("안녕하세요 세계", "cjk"),
        ("नमस्ते दुनिया", "devanagari"),
        ("ሰላም ዓለም", "other"),
        ("12 + 34 = 46", "none"),
        ("", "none"),
        ("Hello мир мир", "cyrillic"),
    ],
)
def test_dominant_script(text, script):
    assert dominant_script(text) == script


def test_documents_without_letters_pass_the_script_filter():
    assert ScriptFilter(["latin"]).check(doc("1 + 1 = 2; 2 * 3 = 6; 10 / 5 = 2")) is None
    assert ScriptFilter([]).check(doc("Привет, мир!")) is None
    with pytest.raises(ValueError, match="unknown scripts"):
        ScriptFilter(["klingon"])


def _reference_symbol_ratio(text: str) -> float:
    nonspace = [c for c in text if not c.isspace()]
    symbols = [
        c for c in nonspace if not c.isalnum() and not unicodedata.category(c).startswith("M")
    ]
    return len(symbols) / len(nonspace) if nonspace else 0.0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_symbol_ratio_matches_a_per_character_reference(text):
    assert symbol_ratio(text) == pytest.approx(_reference_symbol_ratio(text))


def test_symbol_ratio_counts_combining_marks_as_letters():
    assert symbol_ratio("नमस्ते दुनिया") == 0.0
    assert symbol_ratio("a_b") == pytest.approx(1 / 3)
    assert symbol_ratio("   \n\t") == 0.0


def test_filters_pickle_and_stay_deterministic():
    for f in build_filters(FiltersConfig(scripts=["latin", "cyrillic"])):
        g = pickle.loads(pickle.dumps(f))
        for text in (PARAGRAPH, "spam " * 50, "#$%" * 20, "Привет мир"):
            assert g.check(doc(text)) == f.check(doc(text))
        assert g.params() == f.params()


# -- groups and GroupStats -----------------------------------------------------------------


def test_buckets_and_groups():
    assert [length_bucket(n) for n in (0, 99, 100, 999, 1000, 99_999, 100_000, 10**7)] == [
        "<100",
        "<100",
        "100-1k",
        "100-1k",
        "1k-10k",
        "10k-100k",
        ">=100k",
        ">=100k",
    ]
    assert date_bucket("2021-03-04") == "2021"
    assert date_bucket("1999") == "1999"
    assert date_bucket("03/04/2021") == "unknown"
    assert date_bucket(None) == "unknown"
    assert date_bucket("") == "unknown"
    d = Document(id="1", text="x" * 150, source="web", domain="news", lang=None, date="2020-01")
    assert group_of(d) == ("web", "news", "unknown", "100-1k", "2020")


def _run(docs: list[Document], filters) -> tuple[GroupStats, int]:
    stats = GroupStats()
    kept = sum(dropped is None for dropped in apply_filters_batch(filters, docs, stats))
    return stats, kept


FILTERS = build_filters(FiltersConfig(min_chars=10, scripts=["latin"]))

_texts = st.one_of(
    st.text(max_size=300),
    st.sampled_from([PARAGRAPH, "spam " * 60, "#$%^&*" * 30, "Привет, мир! " * 5, "short"]),
)
_docs = st.builds(
    Document,
    id=st.text(min_size=1, max_size=5),
    text=_texts,
    source=st.sampled_from(["web", "books"]),
    domain=st.sampled_from(["news", "code"]),
    lang=st.sampled_from([None, "en", "ru"]),
    date=st.sampled_from([None, "2021-05-01", "1999", "n/a"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_docs, max_size=40), st.data())
def test_group_stats_merge_of_halves_equals_the_whole(docs, data):
    cut = data.draw(st.integers(0, len(docs)))
    whole, _ = _run(docs, FILTERS)
    first, _ = _run(docs[:cut], FILTERS)
    second, _ = _run(docs[cut:], FILTERS)
    assert GroupStats().merge(first).merge(second) == whole
    assert GroupStats().merge(second).merge(first).rows() == whole.rows()
    assert pickle.loads(pickle.dumps(first)).merge(second) == whole


@settings(max_examples=60, deadline=None)
@given(st.lists(_docs, max_size=40))
def test_group_stats_totals_equal_rows_and_conserve_documents(docs):
    stats, kept = _run(docs, FILTERS)
    rows = stats.rows()
    totals = stats.totals()
    json.dumps(rows, allow_nan=False)
    json.dumps(totals, allow_nan=False)
    for step, t in totals.items():
        mine = [r for r in rows if r["step"] == step]
        for name in ("docs_seen", "docs_dropped", "chars_seen", "chars_dropped"):
            assert t[name] == sum(r[name] for r in mine)
        assert sum(t["reasons"].values()) == t["docs_dropped"]
        reasons: dict[str, int] = {}
        for r in mine:
            assert sum(r["reasons"].values()) == r["docs_dropped"] <= r["docs_seen"]
            for reason, n in r["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + n
        assert t["reasons"] == reasons
    # conservation along the chain: what a filter keeps is what the next one sees
    names = [f.name for f in FILTERS]
    seen_before = len(docs)
    for name in names:
        t = totals.get(name, {"docs_seen": 0, "docs_dropped": 0})
        assert t["docs_seen"] == seen_before
        seen_before = t["docs_seen"] - t["docs_dropped"]
    assert seen_before == kept
    assert pickle.loads(pickle.dumps(stats)) == stats  # as a worker's stats reach the stage


def test_group_stats_rows_are_sorted_and_explain_each_drop():
    stats = GroupStats()
    docs = [
        Document(id="a", text="hi", source="web", domain="news", lang="en", date="2020-02-02"),
        Document(id="b", text=PARAGRAPH, source="web", domain="news", lang="en", date="2020"),
        Document(id="c", text="spam " * 100, source="web", domain="news", lang="en"),
        Document(id="d", text="ok", source="books", domain="fiction"),
    ]
    apply_filters_batch(FILTERS, docs, stats)
    rows = stats.rows()
    keys = [
        (r["step"], r["source"], r["domain"], r["lang"], r["length_bucket"], r["date_bucket"])
        for r in rows
    ]
    assert keys == [
        ("length", "books", "fiction", "unknown", "<100", "unknown"),
        ("length", "web", "news", "en", "<100", "2020"),
        ("length", "web", "news", "en", "100-1k", "2020"),
        ("length", "web", "news", "en", "100-1k", "unknown"),
        ("repetition", "web", "news", "en", "100-1k", "2020"),
        ("repetition", "web", "news", "en", "100-1k", "unknown"),
        ("script", "web", "news", "en", "100-1k", "2020"),
        ("symbols", "web", "news", "en", "100-1k", "2020"),
    ]
    assert rows[0]["reasons"] == {"too_short": 1}
    assert rows[5]["reasons"] == {"repeated_ngram": 1}
    assert rows[5]["chars_dropped"] == len("spam " * 100)
    assert stats.totals()["length"] == {
        "docs_seen": 4,
        "docs_dropped": 2,
        "chars_seen": 2 + len(PARAGRAPH) + 500 + 2,
        "chars_dropped": 4,
        "reasons": {"too_short": 2},
    }
    with pytest.raises(ValueError, match="needs a reason"):
        stats.dropped("length", docs[0], "")
