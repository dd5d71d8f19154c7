"""The repetition filter: duplicate lines and the top word 3-gram's share (Gopher-style)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ledgerlm.data.filters.ngrams import repeated_ngram_over, top_ngram_fraction
from ledgerlm.data.records import Document
from ledgerlm.data.steps import Filter


def duplicate_line_fraction(text: str) -> float:
    """Share of non-blank line characters that are redundant copies of an earlier line.

    Only the copies after the first occurrence count: that is the text a reader would lose
    nothing by deleting. Lines compare stripped; blank lines count on neither side.
    Runs over the whole document: a repeat can be arbitrarily far from its original.
    """
    # The copies after the first of each line are all its occurrences less one: the
    # characters of every line less those of the distinct lines (blank ones weigh 0).
    lines = list(map(str.strip, text.split("\n")))
    total = sum(map(len, lines))
    if not total:
        return 0.0
    return (total - sum(map(len, set(lines)))) / total


class RepetitionFilter(Filter):
    """Repeated lines and phrases mark scraped boilerplate, spam and degenerate text.

    In the spirit of Gopher's repetition heuristics (Rae et al. 2021), with two of its
    statistics: duplicate-line characters and top word 3-gram coverage.
    """

    name = "repetition"
    NGRAM = 3
    MIN_WORDS = 20
    SAMPLE_CHARS = 300_000
    WINDOWS = 10

    def __init__(self, max_duplicate_line_fraction: float, max_top_ngram_fraction: float) -> None:
        self.max_duplicate_line_fraction = max_duplicate_line_fraction
        self.max_top_ngram_fraction = max_top_ngram_fraction

    def params(self) -> dict[str, Any]:
        return {
            "max_duplicate_line_fraction": self.max_duplicate_line_fraction,
            "max_top_ngram_fraction": self.max_top_ngram_fraction,
            "ngram": self.NGRAM,
            "min_words": self.MIN_WORDS,
            "ngram_sample": f"{self.WINDOWS} slices when over {self.SAMPLE_CHARS} chars",
        }

    def check(self, doc: Document) -> str | None:
        if duplicate_line_fraction(doc.text) > self.max_duplicate_line_fraction:
            return "duplicate_lines"
        share = top_ngram_fraction(
            doc.text, self.NGRAM, self.MIN_WORDS, self.SAMPLE_CHARS, self.WINDOWS
        )
        if share > self.max_top_ngram_fraction:
            return "repeated_ngram"
        return None

    def check_batch(self, docs: list[Document]) -> list[str | None]:
        """``check`` of every document, the n-gram shares computed for the batch at once."""
        # Both statistics are shares (at most 1): a bound of 1 or more drops nothing, and
        # the statistic need not be computed.
        out: list[str | None] = [None] * len(docs)
        rest = list(range(len(docs)))
        if self.max_duplicate_line_fraction < 1.0:
            rest = []
            for i, doc in enumerate(docs):
                if duplicate_line_fraction(doc.text) > self.max_duplicate_line_fraction:
                    out[i] = "duplicate_lines"
                else:
                    rest.append(i)
        if self.max_top_ngram_fraction >= 1.0:
            return out
        over = repeated_ngram_over(
            [docs[i].text for i in rest], self.max_top_ngram_fraction, self.NGRAM,
            self.MIN_WORDS, self.SAMPLE_CHARS, self.WINDOWS,
        )  # fmt: skip
        for i in np.flatnonzero(over).tolist():
            out[rest[i]] = "repeated_ngram"
        return out
