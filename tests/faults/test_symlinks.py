"""Broken and looping symlinks in a folder source are quarantined, never a crash or a hang."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from data_config import NO_TEMPLATES, data_config
from ledgerlm.data.pipeline import DataError, check_inputs, prepare_data
from ledgerlm.workspace import Workspace

GOOD = {
    "a.txt": "the first file has enough words to pass every filter of the stage",
    "sub/b.md": "a second file in a subfolder, also long enough to be kept as it is",
}


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "d"
    for rel, text in GOOD.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    os.symlink("loop", d / "loop")  # d/loop -> d/loop
    os.symlink("y.txt", d / "x.txt")  # d/x.txt -> d/y.txt -> d/x.txt
    os.symlink("x.txt", d / "y.txt")
    os.symlink("nowhere.txt", d / "dangling.txt")
    os.symlink(str(d), d / "sub" / "up")  # d/sub/up -> d: a folder cycle
    os.symlink(".", d / "self")  # d/self -> d
    return d


BAD = {
    "d/loop": "symlink loop",
    "d/x.txt": "symlink loop",
    "d/y.txt": "symlink loop",
    "d/dangling.txt": "dangling symlink (-> nowhere.txt)",
    "d/sub/up": "symlink cycle",
    "d/self": "symlink cycle",
}


# both good files land in val: a held-out split is never empty
HELD_OUT = {"val_fraction": 0.5, "templates": NO_TEMPLATES}


def test_bad_links_are_quarantined_and_the_build_succeeds(tmp_path, monkeypatch):
    _folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = prepare_data(data_config("d", domain="prose", **HELD_OUT), Workspace(tmp_path / "ws"))
    c = result.manifest["counts"]
    assert c["records_in"] == len(GOOD) + len(BAD)
    assert c["quarantined_by_reason"] == {"unreadable": len(BAD)}
    dropped = sum(d["documents"] for d in c["dropped"])
    assert c["records_in"] == c["kept"] + dropped + c["quarantined"]
    assert c["kept"] == len(GOOD)
    rows = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    assert {r["file"] for r in rows} == set(BAD)
    for r in rows:
        assert r["reason"] == "unreadable" and r["line"] is None
        assert BAD[r["file"]] in r["snippet"], r
    assert not list((tmp_path / "ws" / "data").glob(".building-*"))


def test_a_folder_of_two_cycles_is_listed_quickly(tmp_path, monkeypatch):
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("text")
    os.symlink(".", d / "s1")
    os.symlink(".", d / "s2")
    monkeypatch.chdir(tmp_path)
    (shard,) = check_inputs(data_config("d", domain="prose", **HELD_OUT))
    assert shard.files == ("a.txt", "s1", "s2")


def test_a_link_loop_named_as_the_input_is_a_one_line_error(tmp_path, monkeypatch):
    os.symlink("loop.jsonl", tmp_path / "loop.jsonl")
    os.symlink("gone.jsonl", tmp_path / "dangling.jsonl")
    monkeypatch.chdir(tmp_path)
    for name, why in (("loop.jsonl", "symlink loop"), ("dangling.jsonl", "dangling symlink")):
        with pytest.raises(DataError, match=re.escape(f"input '{name}': {why}")) as err:
            check_inputs(data_config(name, **HELD_OUT))
        assert "\n" not in str(err.value)
    assert not (tmp_path / "ws").exists()


def test_a_broken_link_matched_by_a_glob_is_one_quarantined_record(tmp_path, monkeypatch):
    (tmp_path / "ok.jsonl").write_text('{"text": "one good record that is long enough to keep"}\n')
    os.symlink("loop.jsonl", tmp_path / "loop.jsonl")
    os.symlink("gone.parquet", tmp_path / "gone.parquet")
    monkeypatch.chdir(tmp_path)
    cfg = data_config("*.jsonl", "*.parquet", **HELD_OUT)
    result = prepare_data(cfg, Workspace(tmp_path / "ws"))
    rows = pq.read_table(result.path / "quarantine.parquet").to_pylist()
    assert [(r["file"], r["reason"]) for r in rows] == [
        ("loop.jsonl", "unreadable"),
        ("gone.parquet", "unreadable"),
    ]
    c = result.manifest["counts"]
    assert (c["records_in"], c["kept"], c["quarantined"]) == (3, 1, 2)
