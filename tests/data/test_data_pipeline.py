import pyarrow.parquet as pq
import pytest

from ledgerlm.config import BuiltinCorpusConfig, DataConfig
from ledgerlm.data.dedup import ExactDedup, normalize_text
from ledgerlm.data.pipeline import DataError, prepare_data, split_of
from ledgerlm.workspace import Workspace, file_sha256

SMALL = DataConfig(
    builtin=BuiltinCorpusConfig(code_docs=15, docs_docs=8, math_docs=30, max_doc_chars=3000),
    val_fraction=0.2,
    shard_docs=10,
)


def test_normalization_and_exact_dedup_keep_the_first_seen():
    assert normalize_text("  Hello\tWORLD\n") == normalize_text("hello world")
    d = ExactDedup()
    assert d.check("a", "x = 1\n") is None
    assert d.check("b", "X  =  1") == "a"
    assert d.check("c", "x = 2") is None


def test_split_depends_only_on_the_document_id():
    ids = [f"doc-{i}" for i in range(2000)]
    splits = [split_of(i, 0.1, 0) for i in ids]
    assert 0.07 < splits.count("val") / len(ids) < 0.13
    assert splits == [split_of(i, 0.1, 0) for i in reversed(ids)][::-1]
    assert splits != [split_of(i, 0.1, 1) for i in ids]


def test_prepare_conserves_records_and_writes_a_manifest(tmp_path):
    ws = Workspace(tmp_path)
    result = prepare_data(SMALL, ws)
    m = result.manifest
    c = m["counts"]
    dropped = sum(d["documents"] for d in c["dropped"])
    assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
    assert c["records_in"] == 15 + 8 + 30
    rows = 0
    for f in m["files"]:
        path = result.path / f["path"]
        assert file_sha256(path) == f["sha256"]
        table = pq.read_table(path)
        assert table.num_rows == f["rows"] <= SMALL.shard_docs
        assert set(table.column("id").to_pylist()) and all(
            split_of(i, 0.2, 0) == f["split"] for i in table.column("id").to_pylist()
        )
        rows += table.num_rows
    assert rows == c["kept"]
    assert sum(r["documents"] for r in c["by_split_domain"]) == c["kept"]
    assert {r["domain"] for r in c["by_split_domain"]} == {"code", "docs", "math"}


def test_same_inputs_reuse_the_version_and_other_config_does_not(tmp_path):
    ws = Workspace(tmp_path)
    first = prepare_data(SMALL, ws)
    again = prepare_data(SMALL, ws)
    assert again.reused and again.version == first.version
    other = prepare_data(SMALL.model_copy(update={"val_fraction": 0.3}), ws)
    assert not other.reused and other.version != first.version
    assert sorted(ws.versions("data")) == sorted([first.version, other.version])


def test_deterministic_content_across_workspaces(tmp_path):
    a = prepare_data(SMALL, Workspace(tmp_path / "a"))
    b = prepare_data(SMALL, Workspace(tmp_path / "b"))
    assert a.version == b.version
    assert [f["sha256"] for f in a.manifest["files"]] == [f["sha256"] for f in b.manifest["files"]]


def test_unsupported_source_is_an_error_and_leaves_nothing(tmp_path):
    cfg = SMALL.model_copy(update={"sources": ["s3://bucket/x"]})
    with pytest.raises(DataError, match="unsupported"):
        prepare_data(cfg, Workspace(tmp_path))
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
