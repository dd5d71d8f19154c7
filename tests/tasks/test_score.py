"""choice and bpb tasks scored on a real tiny model: each continuation's log-likelihood is
the one full logits and log_softmax give for the harness's tokens (cut from the left to
seq_len), whatever the batch rows and the order of the items; acc and acc_norm follow
the harness's argmax rules; bits per byte is a ratio of sums; items split over ranks and
summed give the one-process figures, a sharded model running as many forwards on every
rank."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from task_fixtures import ANSWERS, CHOICE, task

from ledgerlm.lab.skeleton import check_task_lengths
from ledgerlm.model.decode import full_logits
from ledgerlm.tasks.encoding import encode_pair
from ledgerlm.tasks.score import (
    Ranks,
    batches,
    choice_scores,
    requests,
    score_task,
    score_tasks,
    width,
)

SEQ = 64
ATOL = 1e-4


def reference(model, tok, bos, context: str, continuation: str, seq_len: int) -> float:
    """The harness's tokens by hand, scored with the full (T, V) logits."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False).ids
    cont = whole[len(tok.encode(context, add_special_tokens=False).ids) :]
    full = [bos, *whole][-(seq_len + 1) :]
    logp = F.log_softmax(full_logits(model, torch.tensor([full[:-1]]))[0].double(), dim=-1)
    targets = full[1:]
    return sum(float(logp[p, targets[p]]) for p in range(len(targets) - len(cont), len(targets)))


@pytest.fixture(scope="module")
def choice_task(tmp_path_factory):
    return task(tmp_path_factory.mktemp("c") / "c.jsonl", CHOICE, "choice", name="pick")


@pytest.mark.parametrize("seq_len", [SEQ, 9])
def test_loglikelihoods_are_those_of_full_logits(model, tok, specials, choice_task, seq_len):
    bos = specials["bos"]
    result = score_task(model, choice_task, tok, bos, seq_len=seq_len, rows=3)
    cut = 0
    for item, lls in zip(choice_task.items, result.per_item["loglik"], strict=True):
        expected = [
            reference(model, tok, bos, item.context, c, seq_len) for c in item.continuations
        ]
        np.testing.assert_allclose(lls, expected, atol=ATOL, rtol=0)
        cut += len(tok.encode(item.context + item.continuations[0]).ids) + 1 > seq_len + 1
    assert (cut > 0) == (seq_len == 9)  # the short window cuts contexts from the left


def test_acc_and_acc_norm_follow_the_harness(model, tok, specials, choice_task):
    result = score_task(model, choice_task, tok, specials["bos"], seq_len=SEQ, rows=4)
    for item, lls, acc, norm in zip(
        choice_task.items, *(result.per_item[k] for k in ("loglik", "acc", "acc_norm")), strict=True
    ):
        assert acc == float(np.argmax(lls) == item.gold)
        assert norm == float(np.argmax(np.array(lls) / [len(c) for c in item.choices]) == item.gold)
    m, p = result.metrics, "task/pick/"
    assert m[p + "acc"] == pytest.approx(np.mean(result.per_item["acc"]))
    assert m[p + "acc_norm"] == pytest.approx(np.mean(result.per_item["acc_norm"]))
    assert m[p + "items"] == len(CHOICE)


def test_acc_norm_divides_by_characters_and_a_tie_goes_to_the_first(tmp_path):
    ts = task(
        tmp_path / "c.jsonl",
        [
            {"context": "q", "choices": ["a", "bbbb"], "gold": 1},
            {"context": "q", "choices": ["a", "b"], "gold": 1},
            {"context": "q", "choices": ["a", "bb"], "gold": 1},
        ],
        "choice",
    )
    # item 1: -2 beats -4, but -4 / 4 beats -2 / 1; item 2: a tie, the first choice wins;
    # item 3: -1.6 / 2 beats -1 / 1 by the choices' lengths, not by the continuations'
    # (" a", " bb": -1 / 2 would beat -1.6 / 3)
    ll = np.array([-2.0, -4.0, -1.0, -1.0, -1.0, -1.6])
    _, per_item = choice_scores(ts.items, ll, "task/t/")
    assert per_item["acc"] == [0.0, 0.0, 0.0] and per_item["acc_norm"] == [1.0, 0.0, 1.0]


@pytest.fixture(scope="module")
def choice_base(model, tok, specials, choice_task):
    return score_task(model, choice_task, tok, specials["bos"], seq_len=SEQ, rows=2)


def _by_line(ts, result) -> dict[int, list[float]]:
    return {it.line: lls for it, lls in zip(ts.items, result.per_item["loglik"], strict=True)}


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.integers(1, 9), order=st.permutations(range(len(CHOICE))))
def test_scores_do_not_depend_on_rows_or_item_order(
    model, tok, specials, choice_task, choice_base, rows, order
):
    bos, base = specials["bos"], choice_base
    shuffled = dataclasses.replace(choice_task, items=tuple(choice_task.items[i] for i in order))
    other = score_task(model, shuffled, tok, bos, seq_len=SEQ, rows=rows)
    want, got = _by_line(choice_task, base), _by_line(shuffled, other)
    for line, lls in want.items():
        np.testing.assert_allclose(got[line], lls, atol=1e-5, rtol=0)
    for key in ("acc", "acc_norm"):
        got_scores = dict(zip([it.line for it in shuffled.items], other.per_item[key], strict=True))
        assert got_scores == dict(zip(want, base.per_item[key], strict=True))
    assert other.metrics == pytest.approx(base.metrics, nan_ok=True)


def test_bits_per_byte_is_a_ratio_of_sums_over_the_continuations_as_scored(
    tmp_path, model, tok, specials
):
    bos = specials["bos"]
    ts = task(tmp_path / "b.jsonl", ANSWERS, "bpb", name="text")
    result = score_task(model, ts, tok, bos, seq_len=SEQ, rows=4)
    nats = [-reference(model, tok, bos, it.context, it.continuations[0], SEQ) for it in ts.items]
    np.testing.assert_allclose(result.per_item["bpb_nats"], nats, atol=ATOL, rtol=0)
    # "def add(a, b):\n" + " return a + b": the newline moves and its byte counts
    assert ts.items[4].context.endswith("\n")
    assert result.per_item["bytes"][4] == len("\n return a + b")
    assert result.per_item["bytes"][0] == len(" 42")
    value = sum(nats) / sum(result.per_item["bytes"]) / math.log(2)
    m = result.metrics
    assert m["task/text/bpb"] == pytest.approx(value, rel=1e-6)
    assert m["task/text/bpb_low"] < m["task/text/bpb"] < m["task/text/bpb_high"]
    assert m["task/text/bpb_stderr"] > 0 and m["task/text/items"] == len(ANSWERS)


def test_the_model_is_called_with_targets_in_few_shapes_and_left_in_its_mode(
    model, tok, specials, choice_task
):
    calls = []

    def hook(module, args, kwargs):
        assert not module.training and "targets" in kwargs  # no (B, T, V) logits asked
        calls.append(tuple(args[0].shape))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    model.train()
    try:
        score_task(model, choice_task, tok, specials["bos"], seq_len=SEQ, rows=4)
    finally:
        handle.remove()
        assert model.training  # given back in the mode it had
        model.eval()
    requests = sum(len(it.continuations) for it in choice_task.items)
    assert len(calls) == -(-requests // 4)
    assert {r for r, _ in calls} == {4} and {t for _, t in calls} <= {SEQ}
    assert [width(n, 1024) for n in (1, 64, 65, 200, 1024)] == [64, 64, 128, 256, 1024]
    assert width(700, 1000) == 1000  # never past seq_len


def test_requests_run_longest_first_rows_to_a_batch(tok, specials, choice_task):
    reqs = requests(choice_task.items, tok, specials["bos"], SEQ, range(len(CHOICE)))
    assert [r.index for r in reqs] == list(range(len(reqs)))  # flat, item by item
    lengths = [len(r.tokens) for batch in batches(reqs, 4) for r in batch]
    assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) > 1
    assert [len(b) for b in batches(reqs, 4)] == [4] * (len(reqs) // 4) + [len(reqs) % 4] * (
        len(reqs) % 4 > 0
    )


GOOD_BPB = {"context": "the cat sat on the", "answer": " mat"}


def test_what_cannot_be_scored_is_refused(tmp_path, model, tok, specials, choice_task):
    ts = task(tmp_path / "e.jsonl", [{"context": "", "answer": "mat"}], "bpb")
    score_task(model, ts, tok, specials["bos"], seq_len=SEQ)  # BOS is the context
    with pytest.raises(ValueError, match="line 1: an empty context needs a BOS token"):
        score_task(model, ts, tok, None, seq_len=SEQ)
    long = task(tmp_path / "l.jsonl", [{"context": "q", "answer": "the cat " * 40}], "bpb")
    with pytest.raises(
        ValueError, match=r"line 1: a continuation of \d+ tokens does not fit seq_len 64"
    ):
        score_task(model, long, tok, specials["bos"], seq_len=SEQ)
    # "hel" + "lo": the whole's tokens after the context's count leave the continuation
    # none of its own (a merge spans the two); scored on no tokens it would have
    # probability 1 and win every comparison
    ctx, cont = encode_pair(tok, "the cat sat on the m", "at")
    assert cont == [] and ctx
    merged = task(
        tmp_path / "m.jsonl",
        [{"context": "the cat sat on the m", "choices": ["at", "x"], "gold": 1}],
        "choice",
        delimiter="",
    )
    with pytest.raises(ValueError, match=r"line 1: choice 0 \('at'\) has no token of its own"):
        score_task(model, merged, tok, specials["bos"], seq_len=SEQ)
    with pytest.raises(ValueError, match="2 ranks need an all_reduce"):
        score_task(model, choice_task, tok, specials["bos"], seq_len=SEQ, ranks=Ranks(0, 2))


def test_a_run_refuses_a_continuation_of_no_tokens_before_training(tmp_path, tok):
    # the check a run makes as it resolves its tasks (and ledgerlm eval before the lock)
    records = [GOOD_BPB, {"context": "the cat sat on the m", "answer": "at"}]
    merged = task(tmp_path / "m.jsonl", records, "bpb", delimiter="")
    path = tmp_path / "m.jsonl"
    with pytest.raises(ValueError, match=rf"^{path}:2: the answer \('at'\) has no token"):
        check_task_lengths([merged], tok, SEQ)
    check_task_lengths([task(path, [GOOD_BPB], "bpb", delimiter="")], tok, SEQ)


def _rank(model, ts, tok, bos, rank, size, reduce=lambda x: x, sharded=False, rows=2):
    return score_task(
        model, ts, tok, bos, seq_len=SEQ, rows=rows, ranks=Ranks(rank, size, sharded, reduce)
    )


@pytest.mark.parametrize("kind", ["choice", "bpb"])
def test_items_split_over_two_ranks_sum_to_one_process(tmp_path, model, tok, specials, kind):
    bos = specials["bos"]
    ts = task(tmp_path / "t.jsonl", CHOICE if kind == "choice" else ANSWERS, kind)
    one = score_task(model, ts, tok, bos, seq_len=SEQ, rows=2)
    key = "loglik" if kind == "choice" else "bpb_nats"
    seen: dict[int, torch.Tensor] = {}

    def keep(rank):
        return lambda x: seen.setdefault(rank, x.clone())

    parts = [_rank(model, ts, tok, bos, r, 2, keep(r)) for r in (0, 1)]
    # each rank's own items, zeros elsewhere: added, the one-process vectors
    flat = [np.hstack(p.per_item[key]) for p in parts]
    np.testing.assert_allclose(flat[0] + flat[1], np.hstack(one.per_item[key]), atol=1e-5, rtol=0)
    assert all(np.count_nonzero(f) > 0 for f in flat)
    # with the other rank's vector as the all_reduce's sum, each rank gets every metric
    for r in (0, 1):
        both = _rank(model, ts, tok, bos, r, 2, lambda x, r=r: x + seen[1 - r])
        assert both.metrics == pytest.approx(one.metrics, rel=1e-6, nan_ok=True)
        assert both.per_item.keys() == one.per_item.keys()


def test_a_sharded_model_runs_as_many_forwards_on_every_rank(tmp_path, model, tok, specials):
    bos = specials["bos"]
    ts = task(tmp_path / "t.jsonl", CHOICE[:3], "choice")  # rank 0: 6 requests, rank 1: 3
    one = score_task(model, ts, tok, bos, seq_len=SEQ, rows=2)
    seen: dict[int, torch.Tensor] = {}
    calls = {}
    for sharded in (False, True):
        for r in (0, 1):
            count = []
            handle = model.register_forward_pre_hook(lambda *a, count=count: count.append(1))
            try:
                _rank(
                    model, ts, tok, bos, r, 2, lambda x, r=r: seen.setdefault(r, x.clone()), sharded
                )
            finally:
                handle.remove()
            calls[sharded, r] = len(count)
    assert (calls[False, 0], calls[False, 1]) == (3, 2)
    assert (calls[True, 0], calls[True, 1]) == (3, 3)  # rank 1 ran a spare batch
    total = (seen[0] + seen[1]).tolist()  # the spare's result was dropped
    flat = [x for lls in one.per_item["loglik"] for x in lls]
    np.testing.assert_allclose(total, flat, atol=1e-5, rtol=0)


def test_a_rank_with_no_items_of_its_own_still_runs_its_forwards(tmp_path, model, tok, specials):
    ts = task(tmp_path / "t.jsonl", CHOICE[:1], "choice")  # one item, two ranks
    count = []
    handle = model.register_forward_pre_hook(lambda *a: count.append(1))
    try:
        idle = _rank(model, ts, tok, specials["bos"], 1, 2, lambda x: x, sharded=True)
    finally:
        handle.remove()
    assert len(count) == 2 and idle.per_item["loglik"] == [[0.0, 0.0, 0.0]]


def test_score_tasks_merges_every_tasks_metric_keys_and_seconds(tmp_path, model, tok, specials):
    pick = task(tmp_path / "c.jsonl", CHOICE, "choice", name="pick")
    text = task(tmp_path / "b.jsonl", ANSWERS, "bpb", name="text")
    metrics, seconds = score_tasks(model, [pick, text], tok, specials["bos"], seq_len=SEQ)
    four = ("", "_stderr", "_low", "_high")
    expected = {f"task/pick/{m}{s}" for m in ("acc", "acc_norm") for s in four}
    expected |= {f"task/text/bpb{s}" for s in four} | {"task/pick/items", "task/text/items"}
    assert set(metrics) == expected
    assert all(isinstance(v, float) for v in metrics.values())
    assert set(seconds) == {"pick", "text"} and all(s > 0 for s in seconds.values())
