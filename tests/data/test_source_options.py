"""Bring your own text: fields of JSONL and Parquet records, text files cut into
documents, and an empty held-out split stopped at the data stage with the fix named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_runner import ledgerlm
from ledgerlm.config import BuiltinCorpusConfig, DataConfig, InputConfig
from ledgerlm.data.pipeline import DataError, prepare_data
from ledgerlm.data.read.find import expand_inputs
from ledgerlm.data.read.reader import read_shard
from ledgerlm.data.read.shard import Quarantined
from ledgerlm.data.read.text import text_pieces
from ledgerlm.workspace import Workspace

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "hex"]


def _read(inp: InputConfig, base: Path) -> list:
    return [r for s in expand_inputs([inp], base) for r in read_shard(s, BuiltinCorpusConfig())]


def test_parquet_with_its_own_field_names(tmp_path):
    rows = {"content": ["first text", "second text"], "doc": ["d1", "d2"], "kind": ["a", "b"]}
    pq.write_table(pa.table(rows), tmp_path / "t.parquet")
    docs = _read(
        InputConfig(path="t.parquet", text_field="content", id_field="doc", domain_field="kind"),
        tmp_path,
    )
    assert [(d.id, d.text, d.domain) for d in docs] == [
        ("d1", "first text", "a"),
        ("d2", "second text", "b"),
    ]
    assert all(d.meta is None for d in docs)  # the mapped fields are not left-over metadata
    unmapped = _read(InputConfig(path="t.parquet"), tmp_path)
    assert all(isinstance(q, Quarantined) and q.reason == "no_text_column" for q in unmapped)


def test_jsonl_with_its_own_field_names(tmp_path):
    lines = [{"body": "some words here", "key": 7, "topic": "news", "text": "not this"}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (doc,) = _read(
        InputConfig(path="t.jsonl", text_field="body", id_field="key", domain_field="topic"),
        tmp_path,
    )
    assert (doc.id, doc.text, doc.domain) == ("7", "some words here", "news")
    assert json.loads(doc.meta) == {"text": "not this"}


def test_a_text_file_cut_into_documents(tmp_path):
    (tmp_path / "book.txt").write_text("One.\nTwo two.\n\n\nThree.\n  \nFour four four.\n")
    by = {
        rule: [(d.id, d.text) for d in _read(InputConfig(path="book.txt", split=rule), tmp_path)]
        for rule in ("file", "blank_lines", "lines")
    }
    assert by["file"] == [("book.txt", "One.\nTwo two.\n\n\nThree.\n  \nFour four four.\n")]
    assert by["blank_lines"] == [
        ("book.txt#1", "One.\nTwo two."),
        ("book.txt#2", "Three."),
        ("book.txt#3", "Four four four.\n"),
    ]
    assert [t for _, t in by["lines"]] == ["One.", "Two two.", "Three.", "Four four four."]
    chunked = _read(InputConfig(path="book.txt", split={"chunk_chars": 100}), tmp_path)
    assert [d.id for d in chunked] == ["book.txt#1"]


@given(
    lines=st.lists(st.text(alphabet="abc \n", max_size=60), max_size=40),
    size=st.integers(10, 200),
)
def test_chunks_keep_every_character_and_cut_at_line_ends(lines, size):
    text = "\n".join(lines)
    pieces = list(text_pieces(text, f"chunk:{size}"))
    # every character but the blank pieces' whitespace, in order
    assert re.sub(r"\s", "", "".join(pieces)) == re.sub(r"\s", "", text)
    for piece in pieces[:-1]:
        # a piece ends at a line end, unless a single line was longer than the size
        assert len(piece) <= size and (piece.endswith("\n") or "\n" not in piece)


def _book(path: Path, paragraphs: int = 300) -> None:
    """A plain-text "book": paragraphs of words between blank lines."""
    out = []
    for i in range(paragraphs):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(12 + i % 9)]
        out.append(f"Chapter {i}. " + " ".join(words) + f" number {i * 31 % 997}.")
    path.write_text("\n\n".join(out) + "\n")


def test_one_big_text_file_is_stopped_at_the_data_stage_with_the_fix(tmp_path):
    _book(tmp_path / "book.txt")
    cfg = DataConfig.model_validate({"sources": [{"path": "book.txt"}], "workers": 1})
    with pytest.raises(DataError, match=r'the val split is empty: .*split = "blank_lines"'):
        prepare_data(cfg, Workspace(tmp_path / "ws"), base=tmp_path)
    assert not (tmp_path / "ws" / "data").exists() or not any((tmp_path / "ws" / "data").iterdir())
    cut = DataConfig.model_validate(
        {"sources": [{"path": "book.txt", "split": "blank_lines"}], "workers": 1}
    )
    result = prepare_data(cut, Workspace(tmp_path / "ws"), base=tmp_path)
    by_split = {r["split"]: r["documents"] for r in result.manifest["counts"]["by_split_domain"]}
    assert by_split["val"] > 0 and by_split["train"] > 200


def test_data_prepare_says_it_in_one_line(tmp_path):
    _book(tmp_path / "book.txt", 40)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[data]\nsources = [{{path = "{tmp_path / "book.txt"}"}}]\n')
    proc = ledgerlm("data", "prepare", str(recipe), "-w", str(tmp_path / "ws"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: the val split is empty") and proc.stderr.count("\n") == 1


def test_a_hugging_face_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets library builds the folder")
    rows = {"content": [f"document number {i} has words" for i in range(5)], "key": list("abcde")}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    both = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    )
    both.save_to_disk(str(tmp_path / "dd"))
    docs = _read(InputConfig(path="ds", text_field="content", id_field="key"), tmp_path)
    assert [(d.id, d.text) for d in docs] == list(zip(rows["key"], rows["content"], strict=True))
    split_docs = _read(InputConfig(path="dd", text_field="content", id_field="key"), tmp_path)
    assert len(split_docs) == 10  # every split of a DatasetDict, in its order
    missing = _read(InputConfig(path="ds"), tmp_path)  # no "text" column: each row says so
    assert all(isinstance(q, Quarantined) and q.reason == "no_text_column" for q in missing)
