"""Records that repeat an id are kept, and counted in the manifest and by `data inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cli_runner import ledgerlm
from data_config import NO_TEMPLATES, data_config
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.workspace import Workspace


def _text(i: int) -> str:
    return f"document {i} says something different from every other one: {i * 31}"


def test_duplicate_ids_across_sources_are_counted_and_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [
        {"id": "a", "text": _text(0)},
        {"id": "b", "text": _text(1)},
        {"id": "a", "text": _text(2)},  # repeats a
        {"id": 7, "text": _text(3)},  # an integer id is the string "7"
        {"text": _text(4)},  # derived id: a.jsonl:5
        {"id": "a", "text": 5},  # quarantined: not a document, not counted
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(
        pa.table({"id": ["7", "c", "b"], "text": [_text(5), _text(6), _text(7)]}),
        tmp_path / "b.parquet",
    )
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "c", "text": _text(8)}) + "\n")
    result = prepare_data(
        data_config("a.jsonl", "b.parquet", "c.jsonl", templates=NO_TEMPLATES),
        Workspace(tmp_path / "ws"),
    )
    c = result.manifest["counts"]
    # a (again in a.jsonl), 7 and b (in b.parquet), c (in c.jsonl)
    assert c["duplicate_ids"] == 4
    assert (c["records_in"], c["kept"], c["quarantined"]) == (10, 9, 1)
    kept = [
        r["id"]
        for f in result.manifest["files"]
        for r in pq.read_table(result.path / f["path"]).to_pylist()
    ]
    assert sorted(kept).count("a") == 2 and kept.count("7") == 2

    shown = ledgerlm("data", "inspect", result.version, "-w", str(tmp_path / "ws")).stdout
    assert "duplicate ids: 4 records repeat an earlier id (kept)" in shown


def test_no_duplicate_ids_no_line(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": _text(i)}) + "\n" for i in range(5))
    )
    result = prepare_data(
        data_config("a.jsonl", templates=NO_TEMPLATES), Workspace(tmp_path / "ws")
    )
    assert result.manifest["counts"]["duplicate_ids"] == 0
    shown = ledgerlm("data", "inspect", result.version, "-w", str(tmp_path / "ws")).stdout
    assert "duplicate ids" not in shown
