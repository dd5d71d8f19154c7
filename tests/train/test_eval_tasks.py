"""Downstream tasks in the evaluator, on a tiny real model, tokenizer and task files: their
metrics in every evaluation, scored on the snapshot the validation loss scored (the
weights training ends on, the asynchronous copy), their seconds in the eval section's
detail, and the confirmation rule reading them (a task target, its interval); exact tasks
refused under FSDP before a run starts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ledgerlm.config import (
    EvalConfig,
    ModelConfig,
    Recipe,
    TaskConfig,
    TokenizerConfig,
    TrainConfig,
)
from ledgerlm.lab.skeleton import check_contract
from ledgerlm.model.gpt import GPT
from ledgerlm.tasks.items import load_task
from ledgerlm.tasks.score import score_tasks
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.tokens.tokenizer import special_ids, train_tokenizer
from ledgerlm.train.distributed import World
from ledgerlm.train.evaluate import EvalCallback
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.record import Recorder, Section
from ledgerlm.train.task_eval import Tasks

SEQ, ROWS = 48, 4
DOMAINS = ["a", "b"]
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
WORDS += ["cat", "dog", "red", "blue", "sum", "is"]


class Kept(Recorder):
    """A recorder that keeps each evaluation with its section's detail."""

    def __init__(self) -> None:
        self.evaluations: list[tuple[dict, dict]] = []

    def evaluation(self, record, section: Section, counters) -> None:
        self.evaluations.append((record, dict(section.detail)))


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, 12)) for _ in range(200)]
    return train_tokenizer(texts, TokenizerConfig(vocab_size=300))


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def task_sets(tmp_path_factory):
    """A choice task, an exact task and a bpb task as real JSONL files."""
    root, rng = tmp_path_factory.mktemp("tasks"), np.random.default_rng(1)
    choice = [
        {
            "context": " ".join(rng.choice(WORDS, 4)),
            "choices": [" ".join(rng.choice(WORDS, int(rng.integers(1, 4)))) for _ in range(3)],
            "gold": int(rng.integers(3)),
        }
        for _ in range(14)
    ]
    pairs = [(int(a), int(b)) for a, b in rng.integers(1, 10, (10, 2))]
    exact = [{"context": f"{a} + {b} =", "answer": str(a + b)} for a, b in pairs]
    bpb = [
        {"context": " ".join(rng.choice(WORDS, 3)), "answer": " ".join(rng.choice(WORDS, 3))}
        for _ in range(12)
    ]
    cfgs = [
        TaskConfig(name="pick", path="pick.jsonl", kind="choice"),
        TaskConfig(name="add", path="add.jsonl", kind="exact", max_new_tokens=3),
        TaskConfig(name="text", path="text.jsonl", kind="bpb"),
    ]
    for cfg, records in zip(cfgs, (choice, exact, bpb), strict=True):
        _write(root / str(cfg.path), records)
    return tuple(load_task(cfg, root / str(cfg.path)) for cfg in cfgs)


def _tasks(tokenizer, sets) -> Tasks:
    ids = special_ids(tokenizer)
    return Tasks(tuple(sets), tokenizer, ids["bos"], ids["eos"], SEQ, ROWS)


def _rows(n: int, vocab: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 30, size=9 * n)
    docs = [(rng.integers(3, vocab, size=k), int(rng.integers(2))) for k in sizes]
    return list(pack_documents(docs, SEQ + 1, 1, 2, 0))[:n]


def _train(tokenizer, sets, *, steps=4, every=2, **eval_kw):
    """A tiny model trained ``steps`` updates, evaluated every ``every``, with the tasks."""
    vocab = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layers=1, n_heads=2), vocab)
    eval_kw.setdefault("target_loss", 0.01)
    cfg = EvalConfig(every_steps=every, tasks=[t.cfg for t in sets], **eval_kw)
    val = list(batches(_rows(2 * ROWS, vocab, 0), ROWS))
    evaluator = EvalCallback(val, cfg, "isolated", DOMAINS, tasks=_tasks(tokenizer, sets))
    train = TrainConfig(max_steps=steps, micro_batch_rows=ROWS, warmup_steps=0, lr=3e-3)
    data = iter(batches(_rows(ROWS * steps, vocab, 1), ROWS))
    recorder = Kept()
    optimizer = build_optimizer(model, train)
    Trainer(model, optimizer, train, data, "isolated", [evaluator], recorder=recorder).fit()
    return model, evaluator, recorder


def _task_metrics(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.startswith("task/")}


KEYS = {
    "pick": ("acc", "acc_norm"),
    "add": ("exact_match",),
    "text": ("bpb",),
}


def test_every_evaluation_scores_the_tasks_on_its_snapshot(tokenizer, task_sets):
    model, evaluator, recorder = _train(tokenizer, task_sets)
    assert [e["step"] for e in evaluator.history] == [2, 4]
    for record, detail in recorder.evaluations:
        m = record["metrics"]
        assert "loss" in m  # the validation loss beside them, in one evaluation
        for name, metrics in KEYS.items():
            assert m[f"task/{name}/items"] == len(
                next(t for t in task_sets if t.name == name).items
            )
            for metric in metrics:
                key = f"task/{name}/{metric}"
                assert math.isfinite(m[key]) and m[f"{key}_stderr"] >= 0
                assert m[f"{key}_low"] <= m[key] <= m[f"{key}_high"]
        assert set(detail["task_seconds"]) == set(KEYS)
        assert all(s > 0 for s in detail["task_seconds"].values())
    # the last evaluation scored the weights training ended on: the tasks scored on them
    # directly give the very same figures
    ids = special_ids(tokenizer)
    direct, _ = score_tasks(
        model, task_sets, tokenizer, ids["bos"], seq_len=SEQ, rows=ROWS,
        decoder_model=model, eos=ids["eos"],
    )  # fmt: skip
    assert _task_metrics(evaluator.history[-1]["metrics"]) == direct
    # and the first evaluation's weights were others: the figures moved
    first = _task_metrics(evaluator.history[0]["metrics"])
    assert first["task/text/bpb"] != direct["task/text/bpb"]


def test_an_asynchronous_evaluation_scores_the_tasks_on_its_copy_as_a_synchronous_one(
    tokenizer, task_sets
):
    _, sync, _ = _train(tokenizer, task_sets, steps=6)
    _, background, recorder = _train(tokenizer, task_sets, steps=6, asynchronous=True)
    assert [e["step"] for e in background.history] == [e["step"] for e in sync.history]
    for a, s in zip(background.history, sync.history, strict=True):
        assert a["snapshot"] == s["snapshot"]  # the same weights were scored
        assert _task_metrics(a["metrics"]) == _task_metrics(s["metrics"])
    threaded = [d for _, d in recorder.evaluations if d.get("asynchronous")]
    assert threaded and all(set(d["task_seconds"]) == set(KEYS) for d in threaded)


def _measured(tokenizer, task_sets) -> dict:
    """The first evaluation's metrics of the run the targets are tried on (the same
    max_steps: the schedule, so the first update, depends on it)."""
    _, evaluator, _ = _train(tokenizer, task_sets, steps=3, every=1)
    return evaluator.history[0]["metrics"]


@pytest.mark.parametrize("metric", ["task/pick/acc", "task/text/bpb"])
def test_a_task_target_confirms_by_its_value_and_the_interval_refuses_it(
    tokenizer, task_sets, metric
):
    """At a threshold between the value and the far end of its 95% interval, the
    threshold rule confirms at the first evaluation and stops training there; the
    interval rule does not (an accuracy's lower bound, bits per byte's upper bound)."""
    m = _measured(tokenizer, task_sets)
    far = m[f"{metric}_low"] if metric.endswith("acc") else m[f"{metric}_high"]
    assert m[metric] > 0 and far != m[metric]  # the test's own premise
    threshold = (m[metric] + far) / 2
    common = {"metric": metric, "targets": {metric: threshold}}
    _, by_value, _ = _train(tokenizer, task_sets, steps=3, every=1, **common)
    assert by_value.reached_step == 1 and len(by_value.history) == 1  # stopped at target
    assert by_value.history[0]["metrics"][metric] == m[metric]
    interval = {**common, "confirm_by": "interval"}
    _, by_interval, _ = _train(tokenizer, task_sets, steps=3, every=1, **interval)
    assert by_interval.history[0]["metrics"][metric] == m[metric]
    assert by_interval.reached_step != 1 and len(by_interval.history) > 1


def test_exact_tasks_under_fsdp_are_refused_in_one_line_before_the_run(task_sets):
    cfgs = [t.cfg.model_copy(update={"path": str(t.path)}) for t in task_sets]
    recipe = Recipe.model_validate({"eval": {"tasks": [c.model_dump() for c in cfgs]}})
    with pytest.raises(ValueError, match=r"eval\.tasks add: .*FSDP shards") as refused:
        check_contract(recipe, World(rank=0, size=2, parallel="fsdp"))
    assert "\n" not in str(refused.value)
    check_contract(recipe, World(rank=0, size=2, parallel="ddp"))  # replicas decode
    without_exact = [c for c in cfgs if c.task_kind != "exact"]
    recipe = Recipe.model_validate({"eval": {"tasks": [c.model_dump() for c in without_exact]}})
    check_contract(recipe, World(rank=0, size=2, parallel="fsdp"))  # log-likelihoods only


def test_a_rank_without_the_items_cannot_score(tokenizer, task_sets):
    pending = Tasks(None, tokenizer, 1, 2, SEQ, ROWS)
    with pytest.raises(RuntimeError, match="not resolved"):
        pending.shared(None)  # one process: nobody to get them from
    assert _tasks(tokenizer, task_sets).shared(None).sets == task_sets
