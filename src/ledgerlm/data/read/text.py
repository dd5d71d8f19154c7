"""Text files: each one document, or cut into pieces by the source's ``split`` rule."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Iterator

from ledgerlm.data.read.files import Unreadable, open_regular
from ledgerlm.data.read.shard import SNIPPET_CHARS, Quarantined, Shard, shard_label, snippet_of
from ledgerlm.data.records import Document


def text_pieces(text: str, rule: str) -> Iterator[str]:
    """A text file's documents under a split rule: the whole file; paragraphs between
    blank lines; lines; or pieces of about N characters cut at a line end (``chunk:N``;
    a line longer than N is cut inside). Blank pieces are left out."""
    if rule == "file":
        pieces: Iterable[str] = [text]
    elif rule == "blank_lines":
        pieces = re.split(r"\n(?:[ \t\r\f\v]*\n)+", text)
    elif rule == "lines":
        pieces = text.splitlines()
    else:
        pieces = _chunks(text, int(rule.removeprefix("chunk:")))
    for piece in pieces:
        if piece.strip():
            yield piece


def _chunks(text: str, size: int) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut >= start else end
        yield text[start:end]
        start = end


def read_text(shard: Shard) -> Iterator[Document | Quarantined]:
    for rel in shard.files:
        label = posixpath.normpath(f"{shard_label(shard)}/{rel}")
        try:
            with open_regular(os.path.join(shard.path, rel)) as f:
                data = f.read()
        except (Unreadable, OSError) as err:
            cause = str(err) if isinstance(err, Unreadable) else (err.strerror or str(err))
            yield Quarantined(label, None, "unreadable", cause[:SNIPPET_CHARS])
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            yield Quarantined(label, None, "invalid_utf8", snippet_of(data))
            continue
        if not text.strip():
            yield Quarantined(label, None, "empty_text", snippet_of(data))
            continue
        if shard.split == "file":
            yield Document(rel, text, shard.source, shard.domain or "default")
            continue
        for k, piece in enumerate(text_pieces(text, shard.split), start=1):
            yield Document(f"{rel}#{k}", piece, shard.source, shard.domain or "default")
