"""Exact deduplication on normalized text.

Memory grows with the number of distinct documents (a 16-byte digest and the
kept id per document), never with their text.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_WS = re.compile(r"\s+")

NORMALIZATION = "nfkc+casefold+collapse-whitespace"


def normalize_text(text: str) -> str:
    """Two documents that differ only in Unicode form, case or spacing are the same."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=16).digest()


class ExactDedup:
    """Keeps the first document of each normalized-text class, in input order."""

    name = "exact_dedup"

    def __init__(self) -> None:
        self._kept: dict[bytes, str] = {}

    def params(self) -> dict[str, str]:
        return {"normalization": NORMALIZATION, "hash": "blake2b-128", "keeper": "first seen"}

    def check(self, doc_id: str, text: str) -> str | None:
        """None when the document is kept, else the id of the kept representative."""
        digest = text_digest(text)
        kept = self._kept.get(digest)
        if kept is None:
            self._kept[digest] = doc_id
        return kept
