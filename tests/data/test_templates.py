"""Requirement D2: lines repeated across many documents of one source are removed, per source."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerlm.config import TemplatesConfig
from ledgerlm.data.records import Document
from ledgerlm.data.templates import (
    LineCounter,
    TemplateRemover,
    TemplateStats,
    line_key,
    min_docs_for,
    template_lines,
)

BANNER = [
    "Copyright (c) 2024 Example Media Group. All rights reserved.",
    "Licensed under CC BY-SA 4.0; see https://example.org/licence for details.",
]
FOOTER = "Subscribe to our newsletter | Contact us | Privacy policy"
CFG = TemplatesConfig()  # min_docs=5, min_doc_fraction=0.05, min_line_chars=20


def body(i: int) -> list[str]:
    return [
        f"Article {i}: the harbour town of Port {i} reported a record catch this week.",
        "",
        "}",
        f"Fishermen said the weather in week {i} had been unusually calm for the season.",
    ]


def web_docs(n: int = 20) -> list[Document]:
    return [
        Document(
            id=f"web-{i}",
            text="\n".join([*BANNER, *body(i), FOOTER]) + "\n",
            source="web",
            domain="news",
        )
        for i in range(n)
    ]


def forum_docs() -> list[Document]:
    """Ten documents of another source; only two carry the banner."""
    out = []
    for i in range(10):
        lines = body(100 + i)
        if i < 2:
            lines = [*BANNER, *lines]
        out.append(Document(id=f"forum-{i}", text="\n".join(lines), source="forum", domain="talk"))
    return out


def code_docs() -> list[Document]:
    """Same source as the web pages, but code: its repeated lines are content."""
    shared = "    raise NotImplementedError('subclasses must implement this')"
    return [
        Document(
            id=f"code-{i}",
            text=f"def f{i}(x):\n{shared}\n{BANNER[0]}\n",
            source="web",
            domain="code",
        )
        for i in range(12)
    ]


def run_both_passes(docs: list[Document], cfg: TemplatesConfig = CFG):
    counter = LineCounter.from_config(cfg)
    for d in docs:
        counter.add(d)
    templates = template_lines(counter, cfg)
    remover = TemplateRemover.from_config(templates, cfg)
    out = [remover.apply(d) for d in docs]
    return templates, remover, out


def test_banner_and_footer_are_removed_from_every_document_of_the_source():
    docs = web_docs() + forum_docs() + code_docs()
    templates, remover, out = run_both_passes(docs)
    assert templates["web"] == {line_key(line) for line in [*BANNER, FOOTER]}
    assert templates["forum"] == set()  # 2 of 10 documents is below min_docs=5

    per_doc_chars = sum(len(line) + 1 for line in [*BANNER, FOOTER])
    for i, (before, (after, lines, chars)) in enumerate(zip(docs[:20], out[:20], strict=True)):
        assert after.text == "\n".join(body(i)) + "\n"  # body kept, in order, blanks too
        assert (lines, chars) == (3, per_doc_chars)
        assert len(before.text) - len(after.text) == chars
        assert (after.id, after.source, after.domain) == (before.id, before.source, before.domain)

    # the same banner in 2 forum documents is content there, not a template
    for before, (after, lines, chars) in zip(docs[20:30], out[20:30], strict=True):
        assert after is before and (lines, chars) == (0, 0)
    # excluded domain: untouched although its lines repeat in 12 documents
    for before, (after, lines, _) in zip(docs[30:], out[30:], strict=True):
        assert after is before and lines == 0

    stats = remover.stats.to_dict()
    json.dumps(stats, allow_nan=False)  # strict JSON: a NaN or an infinity raises
    assert stats["web"]["docs_seen"] == 32
    assert stats["web"]["docs_excluded"] == 12
    assert stats["web"]["docs_touched"] == 20
    assert stats["web"]["lines_removed"] == 60
    assert stats["web"]["chars_removed"] == 20 * per_doc_chars
    assert sorted(stats["web"]["examples"]) == sorted([*BANNER, FOOTER])
    assert stats["forum"] == {
        "docs_seen": 10,
        "docs_excluded": 0,
        "docs_touched": 0,
        "lines_removed": 0,
        "chars_removed": 0,
        "examples": [],
    }


def test_short_lines_are_never_templates():
    docs = [
        Document(
            id=str(i),
            text=f"}}\n\n   \n}}\nbody line {i:04d} is unique\n}}",
            source="s",
            domain="w",
        )
        for i in range(50)
    ]
    counter = LineCounter.from_config(CFG)
    for d in docs:
        counter.add(d)
    # only the unique body lines are long enough (a key in one document at least)
    assert len(counter.keys_at_least("s", 1)) == 50
    templates, remover, out = run_both_passes(docs)
    assert templates == {"s": set()}
    assert all(after is before for before, (after, _, _) in zip(docs, out, strict=True))
    # even a remover handed the key of "}" leaves short lines alone
    remover = TemplateRemover({"s": {line_key("}"), line_key("")}}, min_line_chars=2)
    assert remover.apply(docs[0])[0] is docs[0]


def test_threshold_is_per_source_and_needs_both_bounds():
    assert min_docs_for(20, CFG) == 5
    assert min_docs_for(200, CFG) == 10
    assert min_docs_for(201, CFG) == 11
    frac = TemplatesConfig(min_docs=2, min_doc_fraction=0.05)
    assert min_docs_for(20, frac) == 2  # 0.05 * 20 is 1.0000000000000002 in floats

    line = "Posted in Uncategorized | Leave a comment"
    docs = []
    for i in range(200):
        text = f"unique body text of document {i}, long enough to count"
        if i < 9:  # 9 >= min_docs, but 9 < 5 % of 200
            text += "\n" + line
        docs.append(Document(id=str(i), text=text, source="big", domain="web"))
    templates, _, _ = run_both_passes(docs)
    assert templates["big"] == set()
    templates, _, _ = run_both_passes([*docs, *docs[:1]])  # 10 of 201 docs: still not enough
    assert templates["big"] == set()
    docs[9] = Document(id="9", text=docs[9].text + "\n" + line, source="big", domain="web")
    templates, _, _ = run_both_passes(docs)  # 10 of 200 docs
    assert templates["big"] == {line_key(line)}
    assert template_lines(LineCounter(), TemplatesConfig(enabled=False)) == {}


def test_removal_keeps_line_endings_and_surroundings():
    key = line_key(BANNER[0])
    remover = TemplateRemover({"s": {key}})
    cases = {
        f"{BANNER[0]}\r\nkeep me\r\n": "keep me\r\n",
        f"  {BANNER[0]}  \nkeep": "keep",
        f"a\n\n{BANNER[0]}\n\nb\n": "a\n\n\nb\n",
        f"a\n{BANNER[0]}": "a",
        BANNER[0]: "",
    }
    for text, expected in cases.items():
        after, lines, chars = remover.apply(Document(id="x", text=text, source="s", domain="w"))
        assert after.text == expected
        assert (lines, chars) == (1, len(text) - len(expected))
    other = Document(id="y", text=BANNER[0], source="other", domain="w")
    assert remover.apply(other) == (other, 0, 0)


def test_line_key_is_stable_and_ignores_surrounding_whitespace():
    assert line_key("  hello world \t\r") == line_key("hello world")
    assert line_key("hello world") != line_key("hello  world")
    assert 0 <= line_key("x") < 2**64


def _counter(docs: list[Document], compact_every: int = 1 << 20) -> LineCounter:
    c = LineCounter(min_line_chars=20, exclude_domains=["code"], compact_every=compact_every)
    for d in docs:
        c.add(d)
    return c


def _state(c: LineCounter) -> dict:
    return {s: (c.docs(s), c.counts(s)) for s in c.sources()}


def test_line_counter_counts_each_line_once_per_document():
    text = "\n".join([BANNER[0], BANNER[0], "  " + BANNER[0], BANNER[1]])
    c = _counter([Document(id=str(i), text=text, source="s", domain="w") for i in range(3)])
    assert c.docs("s") == 3
    assert c.counts("s") == {line_key(BANNER[0]): 3, line_key(BANNER[1]): 3}


_line_pool = [*BANNER, FOOTER, "a line that is long enough to count", "}", ""]
_counter_docs = st.lists(
    st.builds(
        lambda lines, source, domain: Document(
            id="x", text="\n".join(lines), source=source, domain=domain
        ),
        st.lists(st.sampled_from(_line_pool), max_size=6),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["web", "code"]),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(_counter_docs, st.data())
def test_line_counter_merge_is_order_independent(docs, data):
    cut = data.draw(st.integers(0, len(docs)))
    every = data.draw(st.sampled_from([1, 3, 1 << 20]))
    whole = _state(_counter(docs))
    left, right = _counter(docs[:cut], every), _counter(docs[cut:], every)
    ab = pickle.loads(pickle.dumps(_counter(docs[:cut]))).merge(right)
    ba = _counter(docs[cut:]).merge(left)
    assert _state(ab) == whole
    assert _state(ba) == whole
    assert _state(left.merge(right).compact()) == whole
    cfg = TemplatesConfig(min_docs=2, min_doc_fraction=0.1)
    assert template_lines(ab, cfg) == template_lines(_counter(docs), cfg)


def test_line_counter_compacts_into_arrays():
    docs = web_docs(50)
    c = _counter(docs, compact_every=7)
    assert len(c.keys_at_least("web", 1)) == 3 + 2 * 50
    assert c.nbytes() == 16 * (3 + 2 * 50)
    assert _state(c) == _state(_counter(docs))
    with pytest.raises(ValueError, match="min_line_chars"):
        c.merge(LineCounter(min_line_chars=5))


def test_template_stats_merge_and_round_trip():
    docs = web_docs()
    templates, _, _ = run_both_passes(docs)
    whole = TemplateRemover(templates)
    a, b = TemplateRemover(templates), TemplateRemover(templates)
    for i, d in enumerate(docs):
        whole.apply(d)
        (a if i % 3 else b).apply(d)
    merged = TemplateStats().merge(b.stats).merge(a.stats)
    assert merged == whole.stats
    assert merged.to_dict() == whole.stats.to_dict()
    assert TemplateStats.from_dict(json.loads(json.dumps(merged.to_dict()))) == whole.stats
    assert pickle.loads(pickle.dumps(whole)).stats == whole.stats
