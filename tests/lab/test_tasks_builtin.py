"""A recipe's tasks as task sets: built-in tasks written once per data version into the
workspace (real JSONL, reused while intact, made again when not), their contaminated
items dropped and counted; task files read from the current directory."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from ledgerlm.config import DataConfig, TaskConfig, TokenizerConfig
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.lab.tasks import builtin_config, materialize, resolve_tasks, task_file, task_record
from ledgerlm.tasks.items import TaskFileError
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.workspace import Workspace

# math_docs well above what a few-thousand-item task needs to meet the corpus by chance
CORPUS = {"code_docs": 80, "docs_docs": 10, "math_docs": 300, "max_doc_chars": 6000}


@pytest.fixture(scope="module")
def version(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    ws = Workspace(root / "ws")
    cfg = DataConfig.model_validate(
        {"sources": ["builtin:stdlib"], "workers": 1, "val_fraction": 0.15, "builtin": CORPUS}
    )
    data = prepare_data(cfg, ws)
    store = TokenStore(build_tokens(data, TokenizerConfig(vocab_size=512), ws).path)
    return ws, data, store


def _split(data, split, domain):
    rows = []
    for f in data.manifest["files"]:
        if f["split"] == split:
            table = pq.read_table(data.path / f["path"], columns=["id", "text", "domain"])
            rows += [r for r in table.to_pylist() if r["domain"] == domain]
    return rows


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_arith_scores_no_line_of_the_training_math_documents(version):
    ws, data, _ = version
    path = materialize("arith", ws, data.path)
    assert path == task_file(ws, data.version, "arith")
    records = _records(path)
    made = json.loads(path.with_suffix(".json").read_text())
    trained = {line for r in _split(data, "train", "math") for line in r["text"].splitlines()}
    scored = [f"{r['context']} {r['answer']}" for r in records if r.get("split") != "train"]
    assert scored and not set(scored) & trained
    # what was dropped is what the training text holds: at least the whole training lines
    from ledgerlm.data.builtin_tasks import arith_records

    all_made = [f"{r['context']} {r['answer']}" for r in arith_records() if "split" not in r]
    assert made["made"] == len(all_made) and made["scored"] == len(scored)
    dropped = made["contamination"]["dropped"]
    assert dropped == len(all_made) - len(scored)
    assert dropped >= sum(line in trained for line in all_made) > 0


def test_code_next_line_items_come_from_held_out_documents(version):
    ws, data, _ = version
    records = _records(materialize("code-next-line", ws, data.path))
    held = {r["id"]: r["text"] for s in ("val", "test") for r in _split(data, s, "code")}
    trained = {r["id"] for r in _split(data, "train", "code")}
    assert records
    for r in records:
        assert r["doc"] in held and r["doc"] not in trained
        gold = r["choices"][r["gold"]]
        assert r["context"] + gold + "\n" in held[r["doc"]] + "\n"
        for c in r["choices"]:
            assert any(c in text.splitlines() for text in held.values())


def test_a_built_in_task_file_is_reused_and_made_again_when_damaged(version):
    ws, data, _ = version
    path = materialize("arith", ws, data.path)
    first, stat = path.read_bytes(), path.stat()
    assert materialize("arith", ws, data.path) == path
    again = path.stat()
    assert (again.st_ino, again.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not rewritten
    path.write_bytes(first.replace(b'"answer": "', b'"answer": "9', 1))  # one item changed
    materialize("arith", ws, data.path)
    assert path.read_bytes() == first
    path.with_suffix(".json").write_text("{not json")
    materialize("arith", ws, data.path)
    assert path.read_bytes() == first
    assert json.loads(path.with_suffix(".json").read_text())["data_version"] == data.version


def test_resolve_tasks_loads_built_in_tasks_with_their_own_settings(version):
    ws, data, store = version
    cfgs = [
        TaskConfig(name="sums", builtin="arith", limit=50, few_shot=2),
        TaskConfig(name="lines", builtin="code-next-line", limit=20),
    ]
    sums, lines = resolve_tasks(cfgs, ws, store, data.path)
    assert len(sums.items) == 50 and len(lines.items) == 20
    assert sums.cfg.fewshot_delimiter == "\n" and lines.cfg.delimiter == ""
    item = sums.items[0]
    assert item.context.count("\n") == 2 and item.continuations == (" " + item.answer,)
    assert lines.items[0].continuations == lines.items[0].choices
    # the data version named by the tokens when none is given, and the same file
    again = resolve_tasks(cfgs, ws, store, None)
    assert [t.digest for t in again] == [sums.digest, lines.digest]
    record = task_record(sums)
    assert record["items"] == 50 and record["data_version"] == data.version
    assert record["contamination"]["dropped"] > 0
    assert record["sha256"] == sums.digest


def test_a_built_in_task_has_its_own_delimiters_and_field_names():
    cfg = TaskConfig(name="lines", builtin="code-next-line")
    assert builtin_config(cfg).delimiter == ""
    # as a recipe read back from the ledger names them: every field, at its default
    spelled = TaskConfig.model_validate(cfg.model_dump())
    assert "delimiter" in spelled.model_fields_set
    assert builtin_config(spelled) == builtin_config(cfg)
    with pytest.raises(ValueError, match="has its own delimiter; leave them unset"):
        builtin_config(TaskConfig(name="lines", builtin="code-next-line", delimiter="\t"))
    with pytest.raises(ValueError, match="has its own context_field; leave them unset"):
        builtin_config(TaskConfig(name="x", builtin="arith", context_field="question"))


def test_a_task_file_is_read_from_the_current_directory(version, tmp_path, monkeypatch):
    ws, data, store = version
    (tmp_path / "mine.jsonl").write_text(
        json.dumps({"context": "2 + 2 =", "answer": "4"})
        + "\n"
        + json.dumps({"context": "1 + 1 =", "answer": "2", "split": "train"})
        + "\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = TaskConfig(name="mine", path="mine.jsonl", kind="exact")
    (task,) = resolve_tasks([cfg], ws, store, data.path)
    assert [i.answer for i in task.items] == ["4"]
    assert task_record(task)["path"] == "mine.jsonl"
    os.remove("mine.jsonl")
    with pytest.raises(TaskFileError, match=r"^mine.jsonl: cannot read the task file"):
        resolve_tasks([cfg], ws, store, data.path)


def test_tokens_without_their_data_version_are_one_line(version, tmp_path):
    _, _, store = version
    cfg = TaskConfig(name="sums", builtin="arith")
    with pytest.raises(ValueError, match="is made from the data version of tokens"):
        resolve_tasks([cfg], Workspace(tmp_path / "empty"), store, None)
