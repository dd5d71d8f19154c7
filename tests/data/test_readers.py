"""Readers must keep every record accounted for, in order, across formats and compression."""

from __future__ import annotations

import gzip
import json
import pickle
import random
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerlm.config import BuiltinCorpusConfig, InputConfig
from ledgerlm.data.builtin import read_builtin, stdlib_fingerprint
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.fingerprint import shard_fingerprint
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import (
    QUARANTINE_SCHEMA,
    Quarantined,
    ReaderError,
    Shard,
    quarantine_table,
)
from ledgerlm.data.records import Document

BUILTIN = BuiltinCorpusConfig(code_docs=2, docs_docs=1, math_docs=2)

# (raw line, expected reason or None for a good record); blank lines are not records.
PLANTED: list[tuple[bytes, str | None]] = [
    (b'{"id": "a", "text": "alpha", "lang": "en", "extra": 1, "tags": ["x"]}', None),
    (b'{"text": "oops"', "bad_json"),
    (b"", "blank"),
    (b'{"text": "caf\xe9 \xff"}', "invalid_utf8"),
    (b'{"text": "beta", "domain": "web", "date": "2024-01-02"}', None),
    (b'{"id": "m", "source": "s"}', "missing_text"),
    (b'{"text": 42}', "text_not_string"),
    (b'{"text": "  \\n\\t "}', "empty_text"),
    (b'["text", "in", "an", "array"]', "not_an_object"),
    (b'{"text": "delta", "domain": 5}', "bad_field"),
    (b"   \t", "blank"),
    (b'{"id": 7, "text": "gamma", "source": "custom", "lang": null}', None),
    (b'{"text": "\\ud800 lone surrogate"}', "invalid_utf8"),
    (b'{"text": "null text", "id": true}', "bad_field"),
    (b'{"text": "epsilon"}', None),
]


def _planted_bytes() -> bytes:
    return b"\n".join(raw for raw, _ in PLANTED) + b"\n"


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _shards(base: Path, *inputs: str | InputConfig, per_shard: int = 1000) -> list[Shard]:
    cfgs = [InputConfig(path=i) if isinstance(i, str) else i for i in inputs]
    return expand_inputs(cfgs, base, text_files_per_shard=per_shard)


def _read_all(base: Path, *inputs: str | InputConfig) -> list[Document | Quarantined]:
    return [out for shard in _shards(base, *inputs) for out in read_shard(shard, BUILTIN)]


def test_planted_bad_records_are_quarantined_with_line_and_reason(tmp_path: Path) -> None:
    _write(tmp_path / "data" / "planted.jsonl", _planted_bytes())
    out = _read_all(tmp_path, "data/planted.jsonl")

    records = [(n, r) for n, (_, r) in enumerate(PLANTED, start=1) if r != "blank"]
    assert len(out) == len(records)  # conservation: one output per non-blank line
    bad = [(q.line, q.reason) for q in out if isinstance(q, Quarantined)]
    assert bad == [(n, r) for n, r in records if r is not None]
    assert all(q.file == "data/planted.jsonl" for q in out if isinstance(q, Quarantined))
    snippet = next(q.snippet for q in out if isinstance(q, Quarantined) and q.line == 4)
    assert "\ufffd" in snippet and snippet.startswith('{"text": "caf')

    src = "data/planted.jsonl"
    assert [d for d in out if isinstance(d, Document)] == [
        Document("a", "alpha", src, "default", "en", None, '{"extra":1,"tags":["x"]}'),
        Document(f"{src}:{src}:5", "beta", src, "web", None, "2024-01-02"),
        Document("7", "gamma", "custom", "default"),
        Document(f"{src}:{src}:15", "epsilon", src, "default"),
    ]


def test_source_and_domain_defaults_come_from_the_input(tmp_path: Path) -> None:
    _write(tmp_path / "a.jsonl", b'{"text": "one"}\n{"text": "two", "domain": "code"}\n')
    out = _read_all(tmp_path, InputConfig(path="a.jsonl", source="web", domain="prose"))
    assert [(d.id, d.source, d.domain) for d in out] == [
        ("web:a.jsonl:1", "web", "prose"),
        ("web:a.jsonl:2", "web", "code"),
    ]


def _normalized(out: list[Document | Quarantined], name: str) -> list[tuple[object, ...]]:
    """Ids and file labels name the file, which is the one thing that differs by format."""
    rows: list[tuple[object, ...]] = []
    for item in out:
        if isinstance(item, Quarantined):
            rows.append(("q", item.file.replace(name, "F"), item.line, item.reason, item.snippet))
        else:
            rows.append(("d", item.id.replace(name, "F"), item.text, item.domain, item.meta))
    return rows


def test_compressed_jsonl_reads_like_plain(tmp_path: Path) -> None:
    results = []
    for name in ("p.jsonl", "p.jsonl.gz", "p.jsonl.zst", "p.ndjson.zst"):
        _write(tmp_path / name, _planted_bytes())
        src = InputConfig(path=name, source="s")
        results.append(_normalized(_read_all(tmp_path, src), name))
    assert results[0] and all(r == results[0] for r in results)


def _many_records(n: int) -> list[bytes]:
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    return [
        json.dumps({"text": " ".join(rng.choice(words) for _ in range(30)), "n": i}).encode()
        for i in range(n)
    ]


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.jsonl.zst"])
def test_truncated_stream_keeps_what_came_before_and_quarantines_once(
    tmp_path: Path, name: str
) -> None:
    lines = _many_records(3000)
    path = _write(tmp_path / name, b"\n".join(lines) + b"\n")
    full = path.read_bytes()
    path.write_bytes(full[: len(full) // 2])

    out = _read_all(tmp_path, name)
    docs, last = out[:-1], out[-1]
    assert isinstance(last, Quarantined) and last.reason == "corrupt_stream"
    assert all(isinstance(d, Document) for d in docs)
    assert 0 < len(docs) < len(lines)
    assert [d.meta for d in docs] == [
        json.dumps({"n": i}).replace(" ", "") for i in range(len(docs))
    ]
    assert last.line == len(docs) + 1 and last.file == name


def test_garbage_compressed_file_is_one_corrupt_entry(tmp_path: Path) -> None:
    (tmp_path / "junk.jsonl.zst").write_bytes(b"this is not zstd at all\n" * 10)
    (tmp_path / "junk.jsonl.gz").write_bytes(b"this is not gzip either\n" * 10)
    for name in ("junk.jsonl.gz", "junk.jsonl.zst"):
        out = _read_all(tmp_path, name)
        assert [(q.line, q.reason) for q in out] == [(1, "corrupt_stream")]


def test_concatenated_members_and_frames_are_all_read(tmp_path: Path) -> None:
    parts = [b'{"text": "one"}\n', b'{"text": "two"}\n{"text": "three"}\n']
    (tmp_path / "m.jsonl.gz").write_bytes(b"".join(gzip.compress(p) for p in parts) + b"\0" * 8)
    zstd = zstandard.ZstdCompressor()
    (tmp_path / "m.jsonl.zst").write_bytes(b"".join(zstd.compress(p) for p in parts))
    for name in ("m.jsonl.gz", "m.jsonl.zst"):
        out = _read_all(tmp_path, name)
        assert [d.text for d in out] == ["one", "two", "three"]  # type: ignore[union-attr]


def test_empty_compressed_files_have_no_records(tmp_path: Path) -> None:
    _write(tmp_path / "e.jsonl.gz", b"")
    _write(tmp_path / "e.jsonl.zst", b"")
    (tmp_path / "raw.jsonl.zst").write_bytes(b"")
    assert _read_all(tmp_path, "e.jsonl.gz", "e.jsonl.zst", "raw.jsonl.zst") == []


def test_parquet_rows_become_documents_or_quarantine(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["r1", None, "r3", "r4"],
            "text": ["first", None, "third", "   "],
            "lang": ["en", "en", None, "en"],
            "score": [0.5, 0.1, 0.9, 0.2],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    out = _read_all(tmp_path, InputConfig(path="t.parquet", domain="web"))
    assert out[0] == Document("r1", "first", "t.parquet", "web", "en", None, '{"score":0.5}')
    assert isinstance(out[1], Quarantined)
    assert (out[1].file, out[1].line, out[1].reason) == ("t.parquet", 2, "missing_text")
    assert out[2] == Document("r3", "third", "t.parquet", "web", None, None, '{"score":0.9}')
    assert isinstance(out[3], Quarantined) and (out[3].line, out[3].reason) == (4, "empty_text")


def test_parquet_non_string_text_column_quarantines_every_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "n.parquet")
    out = _read_all(tmp_path, "n.parquet")
    assert [(q.line, q.reason) for q in out] == [(i, "text_not_string") for i in (1, 2, 3)]


def test_parquet_without_text_column_quarantines_every_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": ["x", "y"]}), tmp_path / "notext.parquet")
    (shard,) = _shards(tmp_path, "notext.parquet")
    out = list(read_shard(shard, BUILTIN))
    assert [(q.file, q.line, q.reason) for q in out] == [  # type: ignore[union-attr]
        ("notext.parquet", 1, "no_text_column"),
        ("notext.parquet", 2, "no_text_column"),
    ]


def _text_folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    _write(root / "a.txt", b"first file\n")
    _write(root / "bad.txt", b"not \xff utf-8")
    _write(root / "empty.md", b"  \n")
    _write(root / "sub" / "b.md", "# title\n\nmore ü".encode())
    _write(root / "sub" / "deep" / "c.txt", b"deep file")
    _write(root / "ignored.bin", b"binary")
    return root


def test_text_folder_ids_are_relative_paths_and_bad_files_quarantined(tmp_path: Path) -> None:
    _text_folder(tmp_path)
    shards = _shards(tmp_path, InputConfig(path="docs", domain="prose"), per_shard=2)
    assert [s.files for s in shards] == [
        ("a.txt", "bad.txt"),
        ("empty.md", "sub/b.md"),
        ("sub/deep/c.txt",),
    ]
    assert [s.index for s in shards] == [0, 1, 2]
    assert {(s.format, s.source, s.domain) for s in shards} == {("text", "docs", "prose")}

    out = [o for s in shards for o in read_shard(s, BUILTIN)]
    assert len(out) == 5
    assert [(q.file, q.line, q.reason) for q in out if isinstance(q, Quarantined)] == [
        ("docs/bad.txt", None, "invalid_utf8"),
        ("docs/empty.md", None, "empty_text"),
    ]
    docs = [d for d in out if isinstance(d, Document)]
    assert [(d.id, d.text, d.domain) for d in docs] == [
        ("a.txt", "first file\n", "prose"),
        ("sub/b.md", "# title\n\nmore ü", "prose"),
        ("sub/deep/c.txt", "deep file", "prose"),
    ]


def test_expand_glob_is_sorted_and_stable(tmp_path: Path) -> None:
    for rel in ("c.jsonl", "a.jsonl", "b/z.jsonl", "b/a.jsonl.gz", "b/skip.txt", "B.parquet"):
        _write(tmp_path / "in" / rel, b'{"text": "x"}\n')
    first = _shards(tmp_path, "in/**/*.jsonl*", "in/*.parquet")
    again = _shards(tmp_path, "in/**/*.jsonl*", "in/*.parquet")
    assert first == again
    assert [s.rel for s in first] == [
        "in/a.jsonl",
        "in/b/a.jsonl.gz",
        "in/b/z.jsonl",
        "in/c.jsonl",
        "in/B.parquet",
    ]
    assert [s.index for s in first] == list(range(5))
    assert {s.source for s in first[:4]} == {"in/**/*.jsonl*"}
    assert [s.format for s in first] == ["jsonl"] * 4 + ["parquet"]
    assert all(Path(s.path).is_absolute() for s in first)


def test_glob_over_folder_and_contents_reads_each_file_once(tmp_path: Path) -> None:
    _text_folder(tmp_path)
    shards = _shards(tmp_path, "docs/**")
    assert [s.files for s in shards] == [
        ("a.txt", "bad.txt", "empty.md", "sub/b.md", "sub/deep/c.txt")
    ]


def test_loose_text_files_from_a_glob_share_the_pattern_root(tmp_path: Path) -> None:
    _text_folder(tmp_path)
    (shard,) = _shards(tmp_path, "docs/**/*.md")
    assert shard.files == ("empty.md", "sub/b.md")
    assert Path(shard.path) == tmp_path / "docs"


@pytest.mark.parametrize("pattern", ["corpus/*.jsonl", "nothing/here.jsonl"])
def test_input_that_matches_nothing_names_the_pattern(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(ReaderError, match=re.escape(f"input '{pattern}'")):
        _shards(tmp_path, pattern)


def test_unknown_extension_and_builtin_name_are_errors(tmp_path: Path) -> None:
    _write(tmp_path / "data.csv", b"a,b\n")
    with pytest.raises(ReaderError, match=re.escape("data.csv")):
        _shards(tmp_path, "data.csv")
    with pytest.raises(ReaderError, match="builtin:wiki"):
        _shards(tmp_path, "builtin:wiki")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReaderError, match="empty"):
        _shards(tmp_path, "empty")


def test_builtin_is_one_shard_that_delegates(tmp_path: Path) -> None:
    (shard,) = _shards(tmp_path, "builtin:stdlib")
    assert shard == Shard(0, "builtin:stdlib", "builtin", "builtin:stdlib", (), None)
    assert list(read_shard(shard, BUILTIN)) == list(read_builtin(BUILTIN))
    assert shard_fingerprint(shard, BUILTIN) == stdlib_fingerprint(BUILTIN)


def test_format_override_reads_an_unrecognised_name(tmp_path: Path) -> None:
    _write(tmp_path / "dump.data", b'{"text": "hello"}\n')
    with pytest.raises(ReaderError, match="unknown extension"):
        _shards(tmp_path, "dump.data")
    (shard,) = _shards(tmp_path, InputConfig(path="dump.data", format="jsonl"))
    assert shard.format == "jsonl"
    assert [d.text for d in read_shard(shard, BUILTIN)] == ["hello"]  # type: ignore[union-attr]


def test_absolute_paths_and_paths_outside_base(tmp_path: Path) -> None:
    outside = _write(tmp_path / "elsewhere" / "x.jsonl", b'{"text": "far"}\n')
    base = tmp_path / "project"
    base.mkdir()
    (shard,) = _shards(base, str(outside))
    assert shard.rel == "" and shard.path == str(outside)
    (doc,) = read_shard(shard, BUILTIN)
    assert isinstance(doc, Document) and doc.id == f"{outside}:x.jsonl:1"


def test_fingerprint_follows_bytes_only(tmp_path: Path) -> None:
    path = _write(tmp_path / "f.jsonl", b'{"text": "one"}\n')
    _text_folder(tmp_path)
    (jsonl,) = _shards(tmp_path, "f.jsonl")
    (folder,) = _shards(tmp_path, "docs")
    before = (shard_fingerprint(jsonl, BUILTIN), shard_fingerprint(folder, BUILTIN))
    assert before == (shard_fingerprint(jsonl, BUILTIN), shard_fingerprint(folder, BUILTIN))
    assert len(before[0]) == 64 and before[0] != before[1]

    path.write_bytes(b'{"text": "one"}\n')  # same bytes rewritten: new mtime, same print
    assert shard_fingerprint(jsonl, BUILTIN) == before[0]
    path.write_bytes(b'{"text": "onE"}\n')
    assert shard_fingerprint(jsonl, BUILTIN) != before[0]
    (tmp_path / "docs" / "sub" / "deep" / "c.txt").write_bytes(b"deep filE")
    assert shard_fingerprint(folder, BUILTIN) != before[1]


def test_quarantine_table_has_the_schema() -> None:
    items = [Quarantined("a.jsonl", 3, "bad_json", "{"), Quarantined("d/x.txt", None, "e", "")]
    table = quarantine_table(items)
    assert table.schema == QUARANTINE_SCHEMA
    assert table.column("line").to_pylist() == [3, None]
    assert quarantine_table([]).num_rows == 0


def test_shards_and_outputs_pickle(tmp_path: Path) -> None:
    _write(tmp_path / "p.jsonl", _planted_bytes())
    _text_folder(tmp_path)
    shards = _shards(tmp_path, "p.jsonl", "docs", "builtin:stdlib")
    assert pickle.loads(pickle.dumps(shards)) == shards
    out = [o for s in shards for o in read_shard(s, BUILTIN)]
    assert {type(o) for o in out} == {Document, Quarantined}
    assert pickle.loads(pickle.dumps(out)) == out
    err = ReaderError("input 'x': matches no file")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


RECORD = st.fixed_dictionaries(
    {"text": st.text(max_size=20)},
    optional={"domain": st.sampled_from(["web", "code", 3]), "x": st.integers()},
)
GARBAGE = st.binary(max_size=30).map(lambda b: b.replace(b"\n", b""))
LINE = st.one_of(RECORD.map(lambda r: json.dumps(r).encode()), GARBAGE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINE, max_size=25), suffix=st.sampled_from([".jsonl", ".jsonl.gz"]))
def test_one_output_per_non_blank_line_in_order(lines: list[bytes], suffix: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        _write(base / f"r{suffix}", b"\n".join(lines))
        out = _read_all(base, InputConfig(path=f"r{suffix}", source="s"))
    expected = [n for n, raw in enumerate(lines, start=1) if raw.strip()]
    got = [o.line if isinstance(o, Quarantined) else int(o.id.rsplit(":", 1)[1]) for o in out]
    assert got == expected
    for o in out:
        if isinstance(o, Document):
            o.text.encode("utf-8")  # whatever comes out can be written as UTF-8
