"""One big file is cut into pieces so that every worker has work: reading the pieces
must give exactly what reading the whole file gives (documents, ids, line numbers,
quarantine entries), and a build's output must not depend on the cuts' consumers (the
worker count), only on the file."""

from __future__ import annotations

import itertools
import json
import random
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_config import data_config
from ledgerlm.config import BuiltinCorpusConfig, InputConfig
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.data.read import jsonl
from ledgerlm.data.read import pieces as read_pieces
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.pieces import split_shards
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined
from ledgerlm.workspace import Workspace

BUILTIN = BuiltinCorpusConfig(code_docs=1, docs_docs=1, math_docs=1)

RECORD = st.fixed_dictionaries(
    {"text": st.text(max_size=40)},
    optional={
        "id": st.one_of(st.text(max_size=5), st.integers(), st.none()),
        "domain": st.sampled_from(["web", "code", 3]),
        "x": st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.none()),
        "nested": st.lists(st.integers(), max_size=2),
    },
)
GARBAGE = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([b"", b"   ", b"\r", b'{"text": "\\ud800"}', b"[1, 2]", b"NaN", b'"x"']),
).map(lambda b: b.replace(b"\n", b""))
LINE = st.one_of(RECORD.map(lambda r: json.dumps(r, ensure_ascii=False).encode()), GARBAGE)


def _read(shards) -> list:
    return [out for s in shards for out in read_shard(s, BUILTIN)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(LINE, max_size=40),
    piece_bytes=st.integers(1, 400),
    bom=st.booleans(),
    newline_at_end=st.booleans(),
)
def test_pieces_read_exactly_what_the_whole_file_reads(lines, piece_bytes, bom, newline_at_end):
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "r.jsonl").write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
        (whole,) = expand_inputs([InputConfig(path="r.jsonl", source="s")], base)
        pieces = split_shards([whole], piece_bytes)
        assert _read(pieces) == _read([whole])
    # pieces cover the file end to end, start at line starts and are numbered in order
    assert [p.index for p in pieces] == list(range(len(pieces)))
    assert pieces[0].start == 0 and pieces[-1].stop is None
    for a, b in itertools.pairwise(pieces):
        assert a.stop == b.start and b.start - a.start >= piece_bytes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINE, max_size=30), bom=st.booleans())
def test_the_fast_json_parser_reads_what_json_reads(lines, bom):
    """orjson where it is sure, the standard library otherwise: the same documents and
    the same quarantine reasons as the standard library alone."""
    pytest.importorskip("orjson")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "r.jsonl").write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines))
        shards = expand_inputs([InputConfig(path="r.jsonl")], base)
        fast = _read(shards)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(jsonl, "_orjson_loads", None)
            assert _read(shards) == fast


def test_cuts_are_line_starts_with_their_line_numbers(tmp_path):
    lines = [json.dumps({"text": f"document {i} " + "x" * (i % 50)}) for i in range(300)]
    lines[17] = "{broken"
    lines[200] = ""
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    (whole,) = expand_inputs([InputConfig(path="big.jsonl")], tmp_path)
    pieces = split_shards([whole], 1000)
    assert len(pieces) > 5
    raw = (tmp_path / "big.jsonl").read_bytes()
    for p in pieces[1:]:
        assert raw[p.start - 1 : p.start] == b"\n"
        assert p.first == raw[: p.start].count(b"\n") + 1
    out = _read(pieces)
    assert out == _read([whole])
    assert [q.line for q in out if isinstance(q, Quarantined)] == [18]
    assert out[-1].id.endswith(":300")


def test_compressed_text_and_small_files_stay_whole(tmp_path):
    import gzip

    body = "\n".join(json.dumps({"text": f"doc {i}"}) for i in range(100)).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(body))
    (tmp_path / "b.jsonl").write_bytes(body)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "x.txt").write_text("some text")
    shards = expand_inputs([InputConfig(path=p) for p in ("a.jsonl.gz", "b.jsonl", "t")], tmp_path)
    assert len(split_shards(shards, 1 << 20)) == 3  # b.jsonl is below the piece size
    pieces = split_shards(shards, 64)
    assert [p.path for p in pieces].count(shards[0].path) == 1  # gzip cannot be cut
    assert [p.path for p in pieces].count(shards[2].path) == 1
    assert [p.path for p in pieces].count(shards[1].path) > 10
    assert _read(pieces) == _read(shards)


def test_parquet_is_cut_at_row_groups(tmp_path):
    rows = [{"text": f"row {i} " + "y" * 40, "id": None if i % 3 else f"r{i}"} for i in range(500)]
    rows[42]["text"] = None  # quarantined: missing_text, row 43
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=37)
    (whole,) = expand_inputs([InputConfig(path="d.parquet")], tmp_path)
    pieces = split_shards([whole], 5000)
    assert 3 < len(pieces) < pq.ParquetFile(tmp_path / "d.parquet").num_row_groups
    out = _read(pieces)
    assert out == _read([whole])
    assert [q.line for q in out if isinstance(q, Quarantined)] == [43]
    # a file that is not Parquet stays one piece (and one quarantined record)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    (bad,) = expand_inputs([InputConfig(path="bad.parquet")], tmp_path)
    assert split_shards([bad], 1) == [bad]


# -- the whole stage ---------------------------------------------------------------------


def _corpus(folder: Path) -> None:
    """One JSONL file of ~80 KB with near duplicates and bad lines, one small gz file."""
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(300)]
    bodies = [" ".join(rng.choice(vocab) for _ in range(120)) for _ in range(300)]
    lines = []
    for i, body in enumerate(bodies):
        lines.append(json.dumps({"text": body, "date": f"20{10 + i % 10}-01-01"}))
        if i % 7 == 0:  # a near duplicate
            words = body.split()
            words[5] = "zzz"
            lines.append(json.dumps({"text": " ".join(words)}))
        if i % 50 == 0:
            lines.append("{not json")
    (folder / "big.jsonl").write_text("\n".join(lines) + "\n")
    import gzip

    (folder / "small.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a small file"}\n'))


WEB = {"domain": "web", "templates": {"min_docs": 2, "min_doc_fraction": 0.0}}


def _files(result) -> dict[str, bytes]:
    names = [f["path"] for f in result.manifest["files"]]
    return {n: (result.path / n).read_bytes() for n in [*names, "drops.parquet", "manifest.json"]}


def test_output_is_the_same_whatever_the_worker_count(tmp_path, monkeypatch):
    folder = tmp_path / "in"
    folder.mkdir()
    _corpus(folder)
    monkeypatch.setattr(read_pieces, "PIECE_BYTES", 10_000)
    one = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=1),
        Workspace(tmp_path / "one"),
    )
    two = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=2),
        Workspace(tmp_path / "two"),
    )
    three = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=3),
        Workspace(tmp_path / "three"),
    )
    assert len({f["path"] for f in one.manifest["files"] if f["split"] == "train"}) > 5
    assert one.version == two.version == three.version
    assert _files(one) == _files(two) == _files(three)


def test_cutting_changes_only_how_the_rows_are_filed(tmp_path, monkeypatch):
    """The same documents, ids, drops, quarantine and counts as one piece per file: only
    the list of output files differs. And the version id does not see the cuts."""
    folder = tmp_path / "in"
    folder.mkdir()
    _corpus(folder)
    whole = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=1),
        Workspace(tmp_path / "whole"),
    )
    monkeypatch.setattr(read_pieces, "PIECE_BYTES", 10_000)
    cut = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=2),
        Workspace(tmp_path / "cut"),
    )
    assert cut.version == whole.version
    a, b = dict(whole.manifest), dict(cut.manifest)
    assert len(b.pop("files")) > len(a.pop("files"))
    assert a == b
    for split in ("train", "val"):
        tables = [
            [pq.read_table(r.path / f["path"]) for f in r.manifest["files"] if f["split"] == split]
            for r in (whole, cut)
        ]
        assert pa.concat_tables(tables[0]).to_pylist() == pa.concat_tables(tables[1]).to_pylist()
    for name in ("drops.parquet", "quarantine.parquet"):
        assert (whole.path / name).read_bytes() == (cut.path / name).read_bytes()
    quarantine = pq.read_table(cut.path / "quarantine.parquet").to_pylist()
    assert [q["line"] for q in quarantine if q["file"].endswith("big.jsonl")] == [
        n
        for n, line in enumerate((folder / "big.jsonl").read_text().splitlines(), 1)
        if line.startswith("{not")
    ]


def test_an_interrupted_cut_build_resumes(tmp_path, monkeypatch):
    from ledgerlm.data import passes

    folder = tmp_path / "in"
    folder.mkdir()
    _corpus(folder)
    monkeypatch.setattr(read_pieces, "PIECE_BYTES", 10_000)
    ws = Workspace(tmp_path / "ws")
    real = passes._clean

    def crash(index, *args):
        if index == 3:
            raise KeyboardInterrupt("killed")
        return real(index, *args)

    monkeypatch.setattr(passes, "_clean", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(data_config(folder / "*.jsonl*", **WEB, workers=1), ws)
    monkeypatch.setattr(passes, "_clean", real)
    monkeypatch.setattr(passes, "_read", lambda *a: pytest.fail("a finished piece was redone"))
    resumed = prepare_data(data_config(folder / "*.jsonl*", **WEB, workers=1), ws)
    monkeypatch.undo()
    monkeypatch.setattr(read_pieces, "PIECE_BYTES", 10_000)
    fresh = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=1),
        Workspace(tmp_path / "fresh"),
    )
    assert _files(resumed) == _files(fresh)


def test_ray_builds_the_same_pieces_byte_for_byte(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    folder = tmp_path / "in"
    folder.mkdir()
    _corpus(folder)
    monkeypatch.setattr(read_pieces, "PIECE_BYTES", 10_000)
    local = prepare_data(
        data_config(folder / "*.jsonl*", **WEB, workers=2),
        Workspace(tmp_path / "local"),
    )
    cfg = data_config(folder / "*.jsonl*", **WEB, workers=2).model_copy(update={"executor": "ray"})
    try:
        on_ray = prepare_data(cfg, Workspace(tmp_path / "ray"))
    finally:
        ray.shutdown()
    assert _files(local) == _files(on_ray)


LINES = ["a banner line that repeats", "another line that repeats", "x", "short"]


@settings(max_examples=60, deadline=None)
@given(
    shards=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["s", "t"]),
                st.lists(st.one_of(st.sampled_from(LINES), st.text(min_size=20)), max_size=6),
            ),
            max_size=12,
        ),
        min_size=1,
        max_size=5,
    ),
    ranges=st.sampled_from([1, 2, 16]),
)
def test_template_lines_of_shards_equal_those_of_their_sum(shards, ranges):
    from ledgerlm.config import TemplatesConfig
    from ledgerlm.data.records import Document
    from ledgerlm.data.templates import LineCounter, shard_template_lines, template_lines

    cfg = TemplatesConfig(min_docs=2, min_doc_fraction=0.1)
    counters, whole = [], LineCounter.from_config(cfg)
    for docs in shards:
        c = LineCounter.from_config(cfg)
        for source, lines in docs:
            doc = Document(id="x", text="\n".join(lines), source=source, domain="web")
            c.add(doc)
            whole.add(doc)
        counters.append(c.compact())
    assert shard_template_lines(counters, cfg, ranges) == template_lines(whole, cfg)
