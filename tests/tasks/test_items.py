"""Task files read into items: every bad record one line naming the file and the line,
few-shot prompts drawn per item with a fixed seed from the train records only, limit,
field names and the file's digest."""

from __future__ import annotations

import hashlib
import random

import pytest
from task_fixtures import ANSWERS, CHOICE, task, write_jsonl

from ledgerlm.config import TaskConfig
from ledgerlm.tasks.items import TaskFileError, load_task

GOOD = {"context": "c", "choices": ["a", "b"], "gold": 1}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a record must be a JSON object, not list"),
        ({"choices": ["a"], "gold": 0}, "missing field 'context'"),
        ({"context": "c", "gold": 0}, "missing field 'choices'"),
        ({"context": "c", "choices": ["a"]}, "missing field 'gold'"),
        ({"context": 3, "choices": ["a"], "gold": 0}, "field 'context' must be a string, not int"),
        ({"context": "c", "choices": [], "gold": 0}, "list of strings, not an empty list"),
        ({"context": "c", "choices": "ab", "gold": 0}, "list of strings, not str"),
        ({"context": "c", "choices": {"text": ["a"]}, "gold": 0}, "list of strings, not dict"),
        ({"context": "c", "choices": ["a", 2], "gold": 0}, "choice 1 must be a string, not int"),
        ({"context": "c", "choices": ["a", ""], "gold": 0}, "choice 1 is empty"),
        ({"context": "c", "choices": ["a"], "gold": True}, "index of the choices, not bool true"),
        ({"context": "c", "choices": ["a"], "gold": 1.0}, "index of the choices, not float 1.0"),
        ({"context": "c", "choices": ["a"], "gold": "A"}, 'index of the choices, not str "A"'),
        ({"context": "c", "choices": ["a"], "gold": "-1"}, 'index of the choices, not str "-1"'),
        ({"context": "c", "choices": ["a", "b"], "gold": "2"}, "gold' = 2 is not an index of 2"),
        ({"context": "c", "choices": ["a", "b"], "gold": 2}, "gold' = 2 is not an index of 2"),
        ({"context": "c", "choices": ["a", "b"], "gold": -1}, "gold' = -1 is not an index of 2"),
    ],
)
def test_a_bad_choice_record_is_one_line_naming_file_and_line(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "t.jsonl", [GOOD, "", "   ", GOOD, bad, GOOD])
    with pytest.raises(TaskFileError) as e:
        load_task(TaskConfig(name="t", path="t.jsonl", kind="choice"), path)
    message = str(e.value)
    assert message.startswith(f"{path}:5: ")  # blank lines still count as lines
    assert reason in message and "\n" not in message


@pytest.mark.parametrize("kind", ["exact", "bpb"])
def test_answer_records_name_their_configured_fields(tmp_path, kind):
    path = write_jsonl(tmp_path / "t.jsonl", [{"q": "c", "a": "x"}, {"q": "c", "answer": "x"}])
    cfg = TaskConfig(name="t", path="t", kind=kind, context_field="q", answer_field="a")
    with pytest.raises(TaskFileError, match=rf"^{path}:2: missing field 'a'"):
        load_task(cfg, path)
    write_jsonl(path, [{"q": "c", "a": None}])
    with pytest.raises(TaskFileError, match=rf"^{path}:1: field 'a' must be a string, not null"):
        load_task(cfg, path)
    write_jsonl(path, [{"q": "the cat", "a": "sat"}])
    (item,) = load_task(cfg, path).items
    assert (item.context, item.continuations, item.choices, item.answer) == (
        "the cat",
        (" sat",),
        ("sat",),
        "sat",
    )


def test_a_gold_index_written_as_digits_is_read_as_the_harness_reads_it(tmp_path):
    # Hugging Face's HellaSwag: {"ctx": ..., "endings": [...], "label": "3"}
    record = {"ctx": "c", "endings": ["a", "b", "c", "d"], "label": "3"}
    path = write_jsonl(tmp_path / "hs.jsonl", [record])
    cfg = TaskConfig(
        name="hs", path="hs", kind="choice", context_field="ctx", choices_field="endings",
        gold_field="label",
    )  # fmt: skip
    (item,) = load_task(cfg, path).items
    assert (item.gold, item.answer) == (3, "d")


def test_a_few_shot_example_without_an_answer_is_refused(tmp_path):
    records = [{"context": "q", "answer": "", "split": "train"}, {"context": "c", "answer": "x"}]
    path = write_jsonl(tmp_path / "t.jsonl", records)
    cfg = TaskConfig(name="t", path="t", kind="exact")
    assert len(load_task(cfg, path).items) == 1  # no shots: the pool is never shown
    with pytest.raises(TaskFileError, match=rf"^{path}:1: a few-shot example needs an answer"):
        load_task(cfg.model_copy(update={"few_shot": 1}), path)


def test_a_bpb_record_of_no_bytes_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"context": "c", "answer": ""}])
    load_task(TaskConfig(name="t", path="t", kind="bpb"), path)  # the delimiter is a byte
    with pytest.raises(TaskFileError, match=rf"^{path}:1: field 'answer' is empty .* no bytes"):
        load_task(TaskConfig(name="t", path="t", kind="bpb", delimiter=""), path)
    load_task(TaskConfig(name="t", path="t", kind="exact", delimiter=""), path)


def test_bytes_that_are_not_utf8_are_not_json(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"context": "c", "answer": "a"}\n{"context": "\xff", "answer": "a"}\n')
    with pytest.raises(TaskFileError, match=rf"^{path}:2: not JSON"):
        load_task(TaskConfig(name="t", path="t", kind="exact"), path)


def test_an_empty_file_a_file_of_train_records_and_a_missing_file_are_errors(tmp_path):
    cfg = TaskConfig(name="t", path="t", kind="exact")
    path = write_jsonl(tmp_path / "t.jsonl", ["", " "])
    with pytest.raises(TaskFileError, match=rf"^{path}: no records"):
        load_task(cfg, path)
    write_jsonl(path, [{"context": "c", "answer": "a", "split": "train"}])
    with pytest.raises(TaskFileError, match=rf"^{path}: no records to score"):
        load_task(cfg, path)
    with pytest.raises(TaskFileError, match="cannot read the task file"):
        load_task(cfg, tmp_path / "absent.jsonl")


def test_choice_items_carry_the_delimiter_and_the_raw_choices(tmp_path):
    ts = task(tmp_path / "c.jsonl", CHOICE, "choice", delimiter="::")
    assert [it.line for it in ts.items] == list(range(1, len(CHOICE) + 1))
    first = ts.items[0]
    assert first.context == "the cat sat on the"
    assert first.continuations == ("::mat", "::dog", "::hat")
    assert first.choices == ("mat", "dog", "hat")
    assert (first.gold, first.answer) == (0, "mat")
    assert ts.items[2].answer == "dog sat"
    assert ts.digest == hashlib.sha256((tmp_path / "c.jsonl").read_bytes()).hexdigest()


def _with_pool(n_pool: int) -> list:
    pool = [{"context": f"q{i}", "answer": f"a{i}", "split": "train"} for i in range(n_pool)]
    scored = [dict(r, split="test") for r in ANSWERS]
    return pool[:2] + scored[:3] + pool[2:] + scored[3:]  # train records among the others


def test_few_shot_examples_come_from_the_train_records_drawn_per_item(tmp_path):
    records = _with_pool(5)
    ts = task(tmp_path / "t.jsonl", records, "exact", few_shot=2, seed=7, fewshot_delimiter="|")
    pool = [r for r in records if r["split"] == "train"]
    scored = [r for r in records if r["split"] != "train"]
    assert [it.line for it in ts.items] == [3, 4, 5, 9, 10, 11]  # train records never scored
    for i, (it, r) in enumerate(zip(ts.items, scored, strict=True)):
        shots = random.Random(f"7:{i}").sample(pool, 2)
        expected = "|".join(f"{s['context']} {s['answer']}" for s in shots) + "|" + r["context"]
        assert it.context == expected
        assert it.continuations == (" " + r["answer"],)  # the item's own answer only
    # a seed of its own per item: not every item gets the same examples
    assert len({it.context.rsplit("|", 1)[0] for it in ts.items}) > 1
    again = task(tmp_path / "u.jsonl", records, "exact", few_shot=2, seed=7, fewshot_delimiter="|")
    assert again.items == ts.items
    other = task(tmp_path / "v.jsonl", records, "exact", few_shot=2, seed=8, fewshot_delimiter="|")
    assert other.items != ts.items


def test_limit_keeps_the_first_items_and_their_prompts(tmp_path):
    records = _with_pool(4)
    full = task(tmp_path / "a.jsonl", records, "exact", few_shot=3)
    cut = task(tmp_path / "b.jsonl", records, "exact", few_shot=3, limit=2)
    assert cut.items == full.items[:2]


def test_choice_few_shot_targets_are_the_gold_choices(tmp_path):
    pool = [{"context": "x", "choices": ["no", "yes"], "gold": 1, "split": "train"}]
    ts = task(tmp_path / "c.jsonl", pool + CHOICE[:1], "choice", few_shot=1)
    assert ts.items[0].context == "x yes\n\nthe cat sat on the"  # the harness's defaults


def test_more_shots_than_train_records_names_the_pool(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", _with_pool(2))
    cfg = TaskConfig(name="t", path="t", kind="exact", few_shot=3)
    with pytest.raises(TaskFileError, match=rf"^{path}: few_shot = 3 .* the file has 2$"):
        load_task(cfg, path)
