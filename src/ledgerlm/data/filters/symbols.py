"""The symbol filter: characters that are neither letters, digits nor whitespace."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ledgerlm.data.records import Document
from ledgerlm.data.steps import Filter

# ASCII is classified with bytes.translate on the UTF-8 form (ASCII bytes only ever encode
# ASCII characters); the rarer non-ASCII characters are counted per distinct character.
_ASCII_SYMBOLS = bytes(c for c in range(128) if not (chr(c).isalnum() or chr(c).isspace()))
_ASCII_SPACE = bytes(c for c in range(128) if chr(c).isspace())
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
_SPACE, _ALNUM, _SYMBOL = 0, 1, 2


@functools.lru_cache(maxsize=65_536)
def _char_kind(ch: str) -> int:
    """Combining marks count as letters: they are parts of letters (Devanagari vowel signs,
    Arabic harakat), even though ``str.isalnum`` says no."""
    if ch.isspace():
        return _SPACE
    if ch.isalnum() or unicodedata.category(ch).startswith("M"):
        return _ALNUM
    return _SYMBOL


def symbol_ratio(text: str) -> float:
    """Characters that are neither letters, digits nor whitespace over non-whitespace ones.

    Whitespace is what ``str.isspace`` says; ``_`` is a symbol. Whole text, no sampling:
    the ASCII part costs two ``bytes.translate`` calls.
    """
    raw = text.encode("utf-8", "surrogatepass")
    symbols = len(raw) - len(raw.translate(None, _ASCII_SYMBOLS))
    nonspace = len(text) - (len(raw) - len(raw.translate(None, _ASCII_SPACE)))
    if len(raw) != len(text):
        for ch, n in Counter("".join(_NON_ASCII_RUN.findall(text))).items():
            kind = _char_kind(ch)
            if kind == _SPACE:
                nonspace -= n
            elif kind == _SYMBOL:
                symbols += n
    return symbols / nonspace if nonspace > 0 else 0.0


class SymbolRatioFilter(Filter):
    """Symbol soup is markup debris, encoding garbage or ASCII art, not language.

    Code and math are mostly symbols by nature, so their domains are exempt by default.
    """

    name = "symbols"

    def __init__(self, max_symbol_ratio: float, exclude_domains: Iterable[str] = ()) -> None:
        self.max_symbol_ratio = max_symbol_ratio
        self.exclude_domains = frozenset(exclude_domains)

    def params(self) -> dict[str, Any]:
        return {
            "max_symbol_ratio": self.max_symbol_ratio,
            "exclude_domains": sorted(self.exclude_domains),
        }

    def check(self, doc: Document) -> str | None:
        if doc.domain in self.exclude_domains:
            return None
        return "symbols" if symbol_ratio(doc.text) > self.max_symbol_ratio else None

    def check_batch(self, docs: list[Document]) -> list[str | None]:
        if self.max_symbol_ratio >= 1.0:  # a ratio of symbols to non-space is at most 1
            return [None] * len(docs)
        return [self.check(doc) for doc in docs]
