"""The built-in corpus must be reproducible, correct in its math, and stream lazily."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from ledgerlm.config import BuiltinCorpusConfig
from ledgerlm.data.builtin import read_builtin, stdlib_fingerprint, stdlib_root
from ledgerlm.data.records import (
    DOCUMENT_SCHEMA,
    Document,
    ReadStats,
    documents_to_table,
    table_to_documents,
)

SMALL = BuiltinCorpusConfig(code_docs=20, docs_docs=10, math_docs=10, math_lines=30)
TEST_DIRS = {"test", "tests", "idle_test"}

ARITH = re.compile(r"^(-?\d+) ([-+*/]) (-?\d+) = (-?\d+)$")
PAREN = re.compile(r"^\((\d+) ([-+]) (\d+)\) \* (\d+) = (-?\d+)$")
SOLVE = re.compile(r"^solve (\d+)x \+ (\d+) = (-?\d+): x = (-?\d+)$")
EXPAND = re.compile(r"^expand (\d+)\(x \+ (\d+)\) = (\d+)x \+ (\d+)$")
GCD = re.compile(r"^gcd\((\d+), (\d+)\) = (\d+)$")
POWER = re.compile(r"^(\d+)\^(\d+) = (\d+)$")


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    assert a % b == 0, f"inexact division {a} / {b}"
    return a // b


def _check_math_line(line: str) -> str:
    if m := ARITH.match(line):
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        assert _apply(a, op, b) == c, line
        return "arith"
    if m := PAREN.match(line):
        assert _apply(int(m[1]), m[2], int(m[3])) * int(m[4]) == int(m[5]), line
        return "paren"
    if m := SOLVE.match(line):
        a, b, c, x = (int(g) for g in m.groups())
        assert a * x + b == c, line
        return "solve"
    if m := EXPAND.match(line):
        a, b, coef, const = (int(g) for g in m.groups())
        assert (coef, const) == (a, a * b), line
        return "expand"
    if m := GCD.match(line):
        assert math.gcd(int(m[1]), int(m[2])) == int(m[3]), line
        return "gcd"
    if m := POWER.match(line):
        assert int(m[1]) ** int(m[2]) == int(m[3]), line
        return "power"
    raise AssertionError(f"unrecognised math line: {line!r}")


@pytest.fixture(scope="module")
def small_docs() -> list[Document]:
    return list(read_builtin(SMALL))


def test_two_reads_are_identical(small_docs: list[Document]) -> None:
    assert list(read_builtin(SMALL)) == small_docs


def test_ids_unique_and_domains_counted(small_docs: list[Document]) -> None:
    ids = [d.id for d in small_docs]
    assert len(ids) == len(set(ids))
    assert Counter(d.domain for d in small_docs) == {"code": 20, "docs": 10, "math": 10}
    # Order of yield: code, then docs, then math.
    domains = [d.domain for d in small_docs]
    assert domains == sorted(domains, key=["code", "docs", "math"].index)
    for doc in small_docs:
        assert doc.id.startswith(f"stdlib/{doc.domain}/")
        assert doc.source == f"stdlib:{doc.domain}"
        assert doc.lang == {"code": "python", "docs": "en", "math": "math"}[doc.domain]
        assert doc.text.strip()
    code_ids = [d.id for d in small_docs if d.domain == "code"]
    assert code_ids == sorted(code_ids)
    assert code_ids[0] == "stdlib/code/__future__.py"
    math_ids = [d.id for d in small_docs if d.domain == "math"]
    assert math_ids == [f"stdlib/math/{i:06d}" for i in range(10)]
    assert small_docs[20].id.startswith("stdlib/docs/topics/")


def test_math_lines_are_correct(small_docs: list[Document]) -> None:
    kinds: Counter[str] = Counter()
    for doc in small_docs:
        if doc.domain != "math":
            continue
        lines = doc.text.splitlines()
        assert len(lines) == SMALL.math_lines
        kinds.update(_check_math_line(line) for line in lines)
    assert set(kinds) == {"arith", "paren", "solve", "expand", "gcd", "power"}


def test_math_doc_independent_of_count() -> None:
    def math_docs(n: int) -> list[Document]:
        cfg = BuiltinCorpusConfig(code_docs=0, docs_docs=0, math_docs=n)
        return list(read_builtin(cfg))

    five, ten = math_docs(5), math_docs(10)
    assert ten[:5] == five
    other_seed = list(
        read_builtin(BuiltinCorpusConfig(code_docs=0, docs_docs=0, math_docs=5, seed=1))
    )
    assert [d.text for d in other_seed] != [d.text for d in five]


def test_code_excludes_tests_and_site_packages() -> None:
    cfg = BuiltinCorpusConfig(code_docs=100_000, docs_docs=100_000, math_docs=0)
    docs = list(read_builtin(cfg))
    assert sum(d.domain == "code" for d in docs) > 100
    for doc in docs:
        if doc.id.startswith("stdlib/docs/topics/"):
            continue
        parts = doc.id.split("/")[2:]
        for part in parts:
            assert part not in TEST_DIRS | {"site-packages", "__pycache__"}, doc.id
            assert not part.startswith("test_"), doc.id
        assert "Grammar" not in parts[-1]


def test_max_doc_chars_is_honoured(small_docs: list[Document]) -> None:
    limit = 300
    cfg = SMALL.model_copy(update={"max_doc_chars": limit})
    stats = ReadStats()
    cut = list(read_builtin(cfg, stats))
    assert [d.id for d in cut] == [d.id for d in small_docs]
    expected = 0
    for short, full in zip(cut, small_docs, strict=True):
        assert len(short.text) <= limit
        assert full.text.startswith(short.text)
        if len(full.text) > limit:
            expected += 1
            if "\n" in full.text[1:limit]:
                assert short.text.endswith("\n")
        else:
            assert short.text == full.text
    assert expected > 0
    assert stats.truncated == expected


def test_non_utf8_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "a_good.py").write_text("x = 'caf\u00e9'\n", encoding="utf-8")
    (tmp_path / "b_bad.py").write_bytes("y = 'caf\u00e9'\n".encode("latin-1"))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("z = 1\n", encoding="utf-8")
    cfg = BuiltinCorpusConfig(code_docs=10, docs_docs=0, math_docs=0)
    stats = ReadStats()
    docs = list(read_builtin(cfg, stats, root=tmp_path))
    assert [d.id for d in docs] == ["stdlib/code/a_good.py", "stdlib/code/pkg/mod.py"]
    assert docs[0].text == "x = 'caf\u00e9'\n"
    assert stats.skipped_not_utf8 == ["b_bad.py"]
    assert stats.files_seen == 3
    assert stats.to_dict() == {"files_seen": 3, "skipped_not_utf8": ["b_bad.py"], "truncated": 0}


def test_non_utf8_via_monkeypatched_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad.py").write_bytes(b"s = '\xff'\n")
    monkeypatch.setattr("ledgerlm.data.builtin.stdlib_root", lambda: tmp_path)
    stats = ReadStats()
    docs = list(read_builtin(BuiltinCorpusConfig(code_docs=5, docs_docs=0, math_docs=0), stats))
    assert docs == []
    assert stats.skipped_not_utf8 == ["bad.py"]


def test_fingerprint_stable_and_config_sensitive(tmp_path: Path) -> None:
    first = stdlib_fingerprint(SMALL)
    assert first == stdlib_fingerprint(SMALL)
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    for change in ({"code_docs": 21}, {"seed": 1}, {"max_doc_chars": 999}, {"math_lines": 3}):
        assert stdlib_fingerprint(SMALL.model_copy(update=change)) != first, change

    (tmp_path / "m.py").write_text("a = 1\n", encoding="utf-8")
    before = stdlib_fingerprint(SMALL, root=tmp_path)
    (tmp_path / "m.py").write_text("a = 2\n", encoding="utf-8")
    assert stdlib_fingerprint(SMALL, root=tmp_path) != before


def test_reader_is_lazy() -> None:
    cfg = BuiltinCorpusConfig(code_docs=100_000, docs_docs=100_000, math_docs=100_000)
    stats = ReadStats()
    taken = list(itertools.islice(read_builtin(cfg, stats), 1))
    assert len(taken) == 1
    assert stats.files_seen <= 3


def test_stdlib_root_holds_the_stdlib() -> None:
    assert (stdlib_root() / "os.py").is_file()


def test_documents_round_trip_through_arrow(small_docs: list[Document]) -> None:
    docs = [*small_docs[:3], Document("x", "t", "s", "d", None, "2024-01-01", '{"k": 1}')]
    table = documents_to_table(docs)
    assert table.schema == DOCUMENT_SCHEMA
    assert list(table_to_documents(table)) == docs
    assert documents_to_table([]).num_rows == 0
