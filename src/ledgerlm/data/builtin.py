"""The ``builtin:stdlib`` corpus: code, prose and arithmetic from the running Python alone.

It exists so that the whole pipeline can run offline on any machine. Everything here is
a pure function of the Python installation and the config, and everything streams:
directories are walked lazily in sorted order and a file is read only when its document
is about to be yielded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from ledgerlm.config import BuiltinCorpusConfig
from ledgerlm.data.records import Document, ReadStats
from ledgerlm.workspace import RecordHasher

# Bump when the selection rules or the math generator change, so cached versions expire.
CORPUS_FORMAT = 1

_EXCLUDED_NAMES = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(name: str) -> bool:
    if name in _EXCLUDED_NAMES or name.startswith("test_"):
        return True
    try:  # a name the filesystem could not decode cannot become a valid id
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _walk(root: Path, keep: Callable[[str], bool], prefix: str = "") -> Iterator[str]:
    """Relative POSIX paths in global sorted order, one directory listing at a time.

    Sorting each listing with directories keyed as ``name + "/"`` makes a depth-first
    walk produce exactly the order of sorting all full paths, without collecting them.
    Symlinked directories are not followed, so a link loop cannot hang the reader.
    """
    with os.scandir(root / prefix if prefix else root) as listing:
        entries = [
            (entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name, entry)
            for entry in listing
            if not _excluded(entry.name)
        ]
    for key, entry in sorted(entries, key=lambda pair: pair[0]):
        rel = prefix + entry.name
        if key.endswith("/"):
            yield from _walk(root, keep, rel + "/")
        elif entry.is_file() and keep(entry.name):
            yield rel


def _is_code(name: str) -> bool:
    return name.endswith(".py")


def _is_doc(name: str) -> bool:
    return name.endswith((".txt", ".rst")) and "Grammar" not in name


def _take_files(
    root: Path, keep: Callable[[str], bool], cap: int, stats: ReadStats
) -> Iterator[tuple[str, bytes, str]]:
    """Up to ``cap`` non-empty UTF-8 files as (relpath, bytes, text).

    The cap is checked before a file is opened, so nothing past it is ever read.
    """
    if cap <= 0:
        return
    taken = 0
    for rel in _walk(root, keep):
        data = (root / rel).read_bytes()
        stats.files_seen += 1
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            stats.skipped_not_utf8.append(rel)
            continue
        if not text.strip():
            continue
        yield rel, data, text
        taken += 1
        if taken >= cap:
            return


def _topics(cap: int) -> Iterator[tuple[str, str]]:
    if cap <= 0:
        return
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip it; the files still give prose
        return
    taken = 0
    for key in sorted(topics):
        text = topics[key]
        if not text.strip():
            continue
        yield key, text
        taken += 1
        if taken >= cap:
            return


def _truncate(text: str, limit: int) -> str:
    """Cut at a line boundary so no document ends in the middle of a line."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = head.rfind("\n")
    if cut > 0 and head[: cut + 1].strip():
        return head[: cut + 1]
    return head


def _math_line(rng: random.Random) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        return f"{a} + {b} = {a + b}"
    if kind == 1:
        b, a = sorted((rng.randint(0, 999), rng.randint(0, 999)))
        return f"{a} - {b} = {a - b}"
    if kind == 2:
        a, b = rng.randint(2, 99), rng.randint(2, 12)
        return f"{a} * {b} = {a * b}"
    if kind == 3:
        b, q = rng.randint(2, 12), rng.randint(1, 99)
        return f"{b * q} / {b} = {q}"
    if kind == 4:
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(2, 9)
        if rng.random() < 0.5:
            return f"({a} + {b}) * {c} = {(a + b) * c}"
        return f"({a} - {b}) * {c} = {(a - b) * c}"
    if kind == 5:
        a, b, x = rng.randint(2, 9), rng.randint(1, 30), rng.randint(-9, 15)
        return f"solve {a}x + {b} = {a * x + b}: x = {x}"
    if kind == 6:
        a, b = rng.randint(2, 9), rng.randint(1, 12)
        return f"expand {a}(x + {b}) = {a}x + {a * b}"
    if kind == 7:
        g, m, n = rng.randint(1, 20), rng.randint(1, 15), rng.randint(1, 15)
        return f"gcd({g * m}, {g * n}) = {math.gcd(g * m, g * n)}"
    base, exp = rng.randint(2, 15), rng.randint(2, 3)
    return f"{base}^{exp} = {base**exp}"


def math_document_text(cfg: BuiltinCorpusConfig, index: int) -> str:
    """Seeded by (seed, index) alone, so document i never depends on how many are made."""
    rng = random.Random(f"{cfg.seed}:{index}")
    return "\n".join(_math_line(rng) for _ in range(cfg.math_lines)) + "\n"


def _finish(doc: Document, cfg: BuiltinCorpusConfig, stats: ReadStats) -> Document:
    if len(doc.text) <= cfg.max_doc_chars:
        return doc
    stats.truncated += 1
    text = _truncate(doc.text, cfg.max_doc_chars)
    return Document(doc.id, text, doc.source, doc.domain, doc.lang, doc.date, doc.meta)


def read_builtin(
    cfg: BuiltinCorpusConfig, stats: ReadStats | None = None, root: Path | None = None
) -> Iterator[Document]:
    """Code, then docs, then math; ``root`` replaces the stdlib folder (tests use it)."""
    stats = stats if stats is not None else ReadStats()
    base = root if root is not None else stdlib_root()

    for rel, _, text in _take_files(base, _is_code, cfg.code_docs, stats):
        doc = Document(f"stdlib/code/{rel}", text, "stdlib:code", "code", "python")
        yield _finish(doc, cfg, stats)

    used = 0
    for key, text in _topics(cfg.docs_docs):
        used += 1
        doc = Document(f"stdlib/docs/topics/{key}", text, "stdlib:docs", "docs", "en")
        yield _finish(doc, cfg, stats)
    for rel, _, text in _take_files(base, _is_doc, cfg.docs_docs - used, stats):
        doc = Document(f"stdlib/docs/{rel}", text, "stdlib:docs", "docs", "en")
        yield _finish(doc, cfg, stats)

    for index in range(cfg.math_docs):
        text = math_document_text(cfg, index)
        doc = Document(f"stdlib/math/{index:06d}", text, "stdlib:math", "math", "math")
        yield _finish(doc, cfg, stats)


def stdlib_fingerprint(cfg: BuiltinCorpusConfig, root: Path | None = None) -> str:
    """Identifies the corpus ``read_builtin`` would yield, to decide if a cache is reusable.

    It hashes exactly the files the reader would select (same rules, same caps), so it
    costs one read of those bytes and no decoding work beyond the UTF-8 check.
    """
    base = root if root is not None else stdlib_root()
    h = RecordHasher()
    put = h.put
    put("ledgerlm.builtin", str(CORPUS_FORMAT), sys.version)
    put("config", json.dumps(cfg.model_dump(mode="json"), sort_keys=True))
    scratch = ReadStats()
    for rel, data, _ in _take_files(base, _is_code, cfg.code_docs, scratch):
        put("code", rel, hashlib.sha256(data).hexdigest())
    used = 0
    for key, text in _topics(cfg.docs_docs):
        used += 1
        put("topic", key, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
    for rel, data, _ in _take_files(base, _is_doc, cfg.docs_docs - used, scratch):
        put("doc", rel, hashlib.sha256(data).hexdigest())
    return h.hexdigest()
