"""The script filter: the dominant script of a document's letters."""

from __future__ import annotations

import functools
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ledgerlm.data.filters.ngrams import _windows
from ledgerlm.data.filters.symbols import _NON_ASCII_RUN
from ledgerlm.data.records import Document
from ledgerlm.data.steps import Filter

SCRIPTS = ("latin", "cyrillic", "greek", "arabic", "hebrew", "cjk", "devanagari", "other")
NO_LETTERS = "none"

_NAME_TO_SCRIPT = {
    "LATIN": "latin",
    "CYRILLIC": "cyrillic",
    "GREEK": "greek",
    "ARABIC": "arabic",
    "HEBREW": "hebrew",
    "CJK": "cjk",
    "HIRAGANA": "cjk",
    "KATAKANA": "cjk",
    "HANGUL": "cjk",
    "DEVANAGARI": "devanagari",
}
_WIDTH_PREFIXES = ("FULLWIDTH", "HALFWIDTH")
# Every byte but the ASCII letters: deleting them leaves exactly the ASCII letters.
_NOT_ASCII_LETTER = bytes(c for c in range(256) if not (c < 128 and chr(c).isalpha()))


@functools.lru_cache(maxsize=65_536)
def script_of(ch: str) -> str | None:
    """Script of one letter from its Unicode name, None for a non-letter (marks included:
    they say nothing their base letter does not). Cached, as texts reuse few letters."""
    if not ch.isalpha():
        return None
    if ch.isascii():
        return "latin"
    words = unicodedata.name(ch, "").split()
    if words and words[0] in _WIDTH_PREFIXES:
        words = words[1:]
    return _NAME_TO_SCRIPT.get(words[0], "other") if words else "other"


def dominant_script(text: str, max_chars: int = 20_000, windows: int = 10) -> str:
    """The script of most letters, or ``none`` when there are no letters.

    Texts over ``max_chars`` are read in ``windows`` evenly spaced slices: a majority
    that a sample of thousands of letters cannot see is not a majority worth reporting.
    Ties go to the alphabetically first script, so the answer is deterministic.
    """
    text = "".join(_windows(text, max_chars, windows))
    raw = text.encode("utf-8", "surrogatepass")
    per_script: dict[str, int] = {}
    ascii_letters = len(raw.translate(None, _NOT_ASCII_LETTER))
    if ascii_letters:
        per_script["latin"] = ascii_letters
    if len(raw) != len(text):
        for ch, n in Counter("".join(_NON_ASCII_RUN.findall(text))).items():
            script = script_of(ch)
            if script is not None:
                per_script[script] = per_script.get(script, 0) + n
    if not per_script:
        return NO_LETTERS
    return min(per_script.items(), key=lambda kv: (-kv[1], kv[0]))[0]


class ScriptFilter(Filter):
    """A cheap charset-level language gate: the dominant script of the letters.

    It cannot tell English from French, only Latin from Cyrillic, which is what a
    byte-level tokenizer trained on a small corpus mostly cares about. Documents without
    letters pass: there is no language to judge, and the length and symbol filters own
    such texts.
    """

    name = "script"

    def __init__(self, scripts: Iterable[str]) -> None:
        self.scripts = frozenset(s.lower() for s in scripts)
        unknown = self.scripts - set(SCRIPTS)
        if unknown:
            raise ValueError(
                f"script filter: unknown scripts {sorted(unknown)}; known: {', '.join(SCRIPTS)}"
            )

    def params(self) -> dict[str, Any]:
        return {"scripts": sorted(self.scripts), "sample_chars": 20_000}

    def check(self, doc: Document) -> str | None:
        if not self.scripts:
            return None
        script = dominant_script(doc.text)
        if script == NO_LETTERS or script in self.scripts:
            return None
        return f"script:{script}"
