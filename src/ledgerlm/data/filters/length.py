"""The length filter: the bounds of a document's size in characters."""

from __future__ import annotations

from typing import Any

from ledgerlm.data.records import Document
from ledgerlm.data.steps import Filter


class LengthFilter(Filter):
    """Too little text carries no signal; too much is usually a dump, not a document.

    The lower bound counts characters without surrounding whitespace, so a document of
    blank lines is ``too_short`` rather than slipping through on its newlines.
    """

    name = "length"

    def __init__(self, min_chars: int, max_chars: int) -> None:
        if min_chars < 0 or max_chars < 1 or min_chars > max_chars:
            raise ValueError(f"length filter: bad bounds min={min_chars} max={max_chars}")
        self.min_chars, self.max_chars = min_chars, max_chars

    def params(self) -> dict[str, Any]:
        return {"min_chars": self.min_chars, "max_chars": self.max_chars, "min_on": "stripped"}

    def check(self, doc: Document) -> str | None:
        if len(doc.text) > self.max_chars:
            return "too_long"
        if len(doc.text.strip()) < self.min_chars:
            return "too_short"
        return None
