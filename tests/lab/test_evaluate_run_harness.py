"""The files ``ledgerlm eval --harness`` gives lm-evaluation-harness, and its item
records read back, without running it: the documents are the items ledgerlm scores
(few-shot prompts included), each YAML (written as JSON) reads back as the task
config it was made from whatever its strings hold, and item records become the metric
keys of ``tasks.stats``."""

from __future__ import annotations

import json

import pytest
import yaml

from ledgerlm.config import TaskConfig
from ledgerlm.lab.harness import (
    HarnessError,
    harness_name,
    parse_samples,
    task_config,
    write_tasks,
)
from ledgerlm.tasks import stats
from ledgerlm.tasks.items import load_task

CHOICE = [
    {"context": "x = 1  ", "choices": ["y", " z"], "gold": 1},
    {"context": "é\t", "choices": ["a", "bb", "ccc"], "gold": 0},
    {"context": "pool", "choices": ["p", "q"], "gold": 0, "split": "train"},
]
ANSWERS = [{"context": "2 + 2 =", "answer": "4"}, {"context": "Q: ☃\n", "answer": "snow"}]


def _task(tmp_path, name, kind, records, **cfg):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_task(TaskConfig(name=name, path=str(path), kind=kind, **cfg), path)


def test_the_documents_are_ledgerlms_items_and_the_yaml_reads_back(tmp_path):
    choice = _task(tmp_path, "c", "choice", CHOICE, few_shot=1, delimiter="\n")
    exact = _task(tmp_path, "e", "exact", ANSWERS, stop=["\n\n", 'Q: "x"'], max_new_tokens=5)
    bpb = _task(tmp_path, "b", "bpb", ANSWERS, delimiter=" ")
    folder = write_tasks([choice, exact, bpb], tmp_path / "work")
    for task in (choice, exact, bpb):
        config = yaml.safe_load((folder / f"{task.name}.yaml").read_text(encoding="utf-8"))
        data = tmp_path / "work" / "data" / f"{task.name}.jsonl"
        assert config == task_config(task, data, tmp_path / "work" / "cache")
        assert config["task"] == harness_name(task) and config["num_fewshot"] == 0
        docs = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
        assert [d["context"] for d in docs] == [it.context for it in task.items]
    assert choice.items[0].context.startswith("pool\np\n\n")  # the one-shot prompt, baked in
    docs = [json.loads(x) for x in (tmp_path / "work/data/c.jsonl").read_text().splitlines()]
    assert [(d["choices"], d["gold"]) for d in docs] == [(["y", " z"], 1), (["a", "bb", "ccc"], 0)]

    c = yaml.safe_load((folder / "c.yaml").read_text())
    assert (c["output_type"], c["target_delimiter"]) == ("multiple_choice", "\n")
    assert [m["metric"] for m in c["metric_list"]] == ["acc", "acc_norm"]
    e = yaml.safe_load((folder / "e.yaml").read_text())
    assert e["output_type"] == "generate_until"
    assert e["generation_kwargs"] == {
        "until": ["\n\n", 'Q: "x"'],
        "max_gen_toks": 5,
        "do_sample": False,
        "temperature": 0.0,
    }
    assert e["metric_list"][0]["regexes_to_ignore"] == ["^\\s+", "\\s+$"]
    b = yaml.safe_load((folder / "b.yaml").read_text())
    assert (b["output_type"], b["doc_to_target"]) == ("loglikelihood", "continuation")
    # the harness adds no delimiter to a loglikelihood target: the document carries it
    bdocs = [json.loads(x) for x in (tmp_path / "work/data/b.jsonl").read_text().splitlines()]
    assert [d["continuation"] for d in bdocs] == [" 4", " snow"]


def test_item_records_become_the_metric_keys_of_stats(tmp_path):
    choice = _task(tmp_path, "c", "choice", CHOICE[:2])
    samples = [  # out of order, as a harness may return them
        {"doc_id": 1, "acc": 1.0, "acc_norm": 0.0, "resps": [[[-1.0, False]]] * 3},
        {"doc_id": 0, "acc": 0.0, "acc_norm": 1.0, "resps": [[[-2.0, False]], [[-3.0, True]]]},
    ]
    got = parse_samples(choice, samples, 1.5)
    assert got.per_item["acc"] == [0.0, 1.0] and got.per_item["acc_norm"] == [1.0, 0.0]
    assert got.per_item["loglik"] == [[-2.0, -3.0], [-1.0, -1.0, -1.0]]
    want = {
        **stats.accuracy([0.0, 1.0], "task/c/acc"),
        **stats.accuracy([1.0, 0.0], "task/c/acc_norm"),
        "task/c/items": 2.0,
    }
    assert got.metrics == pytest.approx(want) and got.seconds == 1.5

    bpb = _task(tmp_path, "b", "bpb", ANSWERS)
    samples = [
        {"doc_id": i, "arguments": [[it.context, it.continuations[0]]], "resps": [[[-ll, False]]]}
        for i, (it, ll) in enumerate(zip(bpb.items, (3.0, 5.0), strict=True))
    ]
    got = parse_samples(bpb, samples, 0.5)
    # "Q: ☃\n" + " snow": the newline moves to the continuation, "\n snow" is 6 bytes
    assert got.per_item == {"bpb_nats": [3.0, 5.0], "bytes": [2.0, 6.0]}
    assert got.metrics["task/b/bpb"] == pytest.approx(8.0 / 8.0 / 0.6931471805599453)

    with pytest.raises(HarnessError, match="task b: the harness's 1 item records are not one"):
        parse_samples(bpb, samples[:1], 0.5)
    with pytest.raises(HarnessError, match="2 item records are not one for each of the 2"):
        parse_samples(bpb, [samples[0], samples[0]], 0.5)
