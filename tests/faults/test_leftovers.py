"""A failed build leaves no build folder behind, unless it is one the next build resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_config import NO_TEMPLATES, data_config
from ledgerlm.data import passes, pipeline
from ledgerlm.data.pipeline import DataError, data_version, prepare_data
from ledgerlm.workspace import Workspace


def _texts(n: int, tag: str) -> list[str]:
    return [
        f"{tag} document number {i} with enough distinct words to be kept {i * 7}" for i in range(n)
    ]


def _jsonl(path: Path, texts: list[str]) -> None:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def _building(ws: Path) -> list[Path]:
    return sorted((ws / "data").glob(".building-*"))


def test_parquet_without_text_column_quarantines_its_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"body": ["a", "b", "c"], "n": [1, 2, 3]}), tmp_path / "nt.parquet")
    _jsonl(tmp_path / "ok.jsonl", _texts(4, "ok"))
    result = prepare_data(
        data_config("nt.parquet", "ok.jsonl", templates=NO_TEMPLATES), Workspace(tmp_path / "ws")
    )
    c = result.manifest["counts"]
    assert (c["records_in"], c["kept"], c["quarantined"]) == (7, 4, 3)
    assert c["quarantined_by_reason"] == {"no_text_column": 3}
    rows = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    assert [(r["file"], r["line"], r["reason"]) for r in rows] == [
        ("nt.parquet", i, "no_text_column") for i in (1, 2, 3)
    ]
    assert json.loads(rows[0]["snippet"]) == {"body": "a", "n": 1}
    assert _building(tmp_path / "ws") == []


def test_a_file_that_is_not_parquet_is_one_quarantined_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 but not really parquet at all")
    _jsonl(tmp_path / "ok.jsonl", _texts(2, "ok"))
    result = prepare_data(
        data_config("junk.parquet", "ok.jsonl", templates=NO_TEMPLATES), Workspace(tmp_path / "ws")
    )
    (row,) = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    assert (row["file"], row["line"], row["reason"]) == ("junk.parquet", None, "corrupt_stream")
    assert "not a readable Parquet file" in row["snippet"]
    assert _building(tmp_path / "ws") == []


def test_a_data_error_mid_build_removes_the_build_folder(tmp_path, monkeypatch):
    """An evaluation file that vanishes after the version was decided: a one-line error."""
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "a.jsonl", _texts(6, "a"))
    _jsonl(tmp_path / "bench.jsonl", ["an evaluation question"])
    cfg = data_config(
        "a.jsonl", templates=NO_TEMPLATES, contamination={"eval_files": ["bench.jsonl"]}
    )
    real = pipeline.load_eval_sets

    def vanish_then_load(*args, **kw):
        (tmp_path / "bench.jsonl").unlink()
        return real(*args, **kw)

    monkeypatch.setattr(pipeline, "load_eval_sets", vanish_then_load)
    with pytest.raises(DataError, match=r"input 'bench\.jsonl'") as err:
        prepare_data(cfg, Workspace(tmp_path / "ws"))
    assert "\n" not in str(err.value)
    assert _building(tmp_path / "ws") == []
    assert Workspace(tmp_path / "ws").versions("data") == []


def test_an_interrupted_build_keeps_its_folder_and_the_rerun_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "a.jsonl", _texts(6, "a"))
    _jsonl(tmp_path / "b.jsonl", _texts(6, "b"))
    cfg = data_config("*.jsonl", templates=NO_TEMPLATES)
    ws = Workspace(tmp_path / "ws")
    real_write = passes._write

    def interrupt_second_shard(index, *args):
        if index == 1:
            raise KeyboardInterrupt
        return real_write(index, *args)

    monkeypatch.setattr(passes, "_write", interrupt_second_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, ws)
    (folder,) = _building(tmp_path / "ws")  # the build folder, and no lock file left
    assert folder.is_dir() and (folder / "_work" / "read-1.done").is_file()
    monkeypatch.setattr(passes, "_write", real_write)
    monkeypatch.setattr(passes, "_read", lambda *a: pytest.fail("a finished shard was read again"))
    resumed = prepare_data(cfg, ws)
    assert not resumed.reused and resumed.manifest["counts"]["kept"] == 12
    assert _building(tmp_path / "ws") == []


KILLED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from ledgerlm.config import DataConfig
    from ledgerlm.data import passes
    from ledgerlm.data.pipeline import prepare_data
    from ledgerlm.workspace import Workspace

    cfg, ws, reached = sys.argv[1:]
    real = passes._write

    def hang_on_second(index, *args):
        if index == 1:
            Path(reached).touch()
            time.sleep(600)
        return real(index, *args)

    passes._write = hang_on_second
    prepare_data(DataConfig.model_validate_json(cfg), Workspace(ws))
    """
)


def test_a_killed_build_is_resumed_by_the_next_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "a.jsonl", _texts(6, "a"))
    _jsonl(tmp_path / "b.jsonl", _texts(6, "b"))
    cfg = data_config("*.jsonl", templates=NO_TEMPLATES)
    script, reached = tmp_path / "killed.py", tmp_path / "reached"
    script.write_text(KILLED)
    proc = subprocess.Popen(
        [sys.executable, str(script), cfg.model_dump_json(), str(tmp_path / "ws"), str(reached)],
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while not reached.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert reached.exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    version = data_version(cfg)[0]
    work = tmp_path / "ws" / "data" / f".building-{version}" / "_work"
    assert (work / "write-0.done").is_file() and not (work / "write-1.done").exists()
    monkeypatch.setattr(passes, "_read", lambda *a: pytest.fail("a finished shard was read again"))
    resumed = prepare_data(cfg, Workspace(tmp_path / "ws"))
    assert resumed.version == version and resumed.manifest["counts"]["kept"] == 12
    assert _building(tmp_path / "ws") == []
