"""exact tasks: greedy generation with the KV cache gives the tokens uncached greedy
decoding gives, batched by prompt length or not; a stop string or EOS ends a row and
cuts its text; exact_match compares stripped texts; ranks sum to one process."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from task_fixtures import ANSWERS, task

from ledgerlm.model.decode import generate_uncached
from ledgerlm.tasks.generate import cut, generate_batch
from ledgerlm.tasks.score import Ranks, score_task

SEQ, NEW = 64, 6


def _prompt(tok, bos, context: str, room: int) -> list[int]:
    return [bos, *tok.encode(context, add_special_tokens=False).ids][-room:]


def _uncached(model, prompt: list[int], new: int) -> list[int]:
    return generate_uncached(model, torch.tensor([prompt]), new)[0, len(prompt) :].tolist()


def _exact(model, tok, bos, ts, **kw):
    kw.setdefault("rows", 3)
    return score_task(
        model, ts, tok, bos, seq_len=kw.pop("seq_len", SEQ), decoder_model=model, **kw
    )


def test_generated_tokens_are_uncached_greedy_decodings(tmp_path, wild, tok, specials):
    model, bos = wild, specials["bos"]
    ts = task(tmp_path / "e.jsonl", ANSWERS, "exact", max_new_tokens=NEW, stop=[])
    prompts = [_prompt(tok, bos, it.context, SEQ - NEW) for it in ts.items]
    lengths = [len(p) for p in prompts]
    assert any(lengths.count(n) > 1 for n in lengths)  # some rows share a batch
    for rows in (1, 3):
        result = _exact(model, tok, bos, ts, rows=rows)
        expected = [_uncached(model, p, NEW) for p in prompts]
        assert result.per_item["generated_ids"] == expected
        texts = [tok.decode(ids, skip_special_tokens=True) for ids in expected]
        assert result.per_item["generated"] == texts
    # a context cut from the left so prompt + max_new_tokens fits seq_len
    short = _exact(model, tok, bos, ts, seq_len=NEW + 3)
    cut_prompts = [_prompt(tok, bos, it.context, 3) for it in ts.items]
    assert short.per_item["generated_ids"] == [_uncached(model, p, NEW) for p in cut_prompts]


def _clean_stop(tok, generations: list[list[int]]) -> tuple[int, str]:
    """An item and a stop string: the text of a token past its first that decodes alone
    to printable text (not a piece of a UTF-8 character)."""
    for i, ids in enumerate(generations):
        for k in range(1, len(ids) - 1):
            text = tok.decode(ids[k : k + 1])
            if text.strip() and text.isprintable() and "\ufffd" not in text:
                return i, text
    raise AssertionError(f"no clean token in {generations}")


def test_a_stop_string_ends_the_generation_and_cuts_its_text(tmp_path, wild, tok, specials):
    model, bos = wild, specials["bos"]
    free = task(tmp_path / "a.jsonl", ANSWERS, "exact", max_new_tokens=NEW, stop=[])
    generations = _exact(model, tok, bos, free).per_item["generated_ids"]
    i, stop = _clean_stop(tok, generations)
    ids = generations[i]
    text = tok.decode(ids, skip_special_tokens=True)
    first = text.find(stop)
    assert first >= 0 and stop
    records = [dict(ANSWERS[i], answer=f"  {text[:first]} ")]  # compared stripped
    stopped = task(tmp_path / "b.jsonl", records, "exact", max_new_tokens=NEW, stop=["@@", stop])
    result = _exact(model, tok, bos, stopped)
    got = result.per_item["generated_ids"][0]
    assert ids[: len(got)] == got and len(got) < NEW  # ended early, a prefix of the free run
    assert stop in tok.decode(got) and stop not in tok.decode(got[:-1])
    assert result.per_item["generated"] == [text[:first]]
    assert result.per_item["exact_match"] == [1.0]
    assert result.metrics["task/t/exact_match"] == 1.0


def test_eos_ends_the_generation_and_is_not_text(tmp_path, wild, tok, specials):
    model, bos = wild, specials["bos"]
    ts = task(tmp_path / "a.jsonl", ANSWERS[:1], "exact", max_new_tokens=NEW, stop=[])
    ids = _exact(model, tok, bos, ts).per_item["generated_ids"][0]
    ended = _exact(model, tok, bos, ts, eos=ids[1])
    assert ended.per_item["generated_ids"] == [ids[: ids.index(ids[1]) + 1]]
    assert ended.per_item["generated"] == [tok.decode(ids[: ids.index(ids[1])])]


def test_a_row_that_ended_keeps_its_tokens_while_its_batch_goes_on(wild, tok, specials):
    bos = specials["bos"]
    prompts = [[bos, t] for t in (270, 263, 298, 105)]  # one length: one batch
    free = generate_batch(wild, prompts, NEW, tok, [], None)
    eos = free[0][1]
    assert all(eos not in ids for ids in free[1:])  # only row 0 meets it
    batched = generate_batch(wild, prompts, NEW, tok, [], eos)
    assert batched == [generate_batch(wild, [p], NEW, tok, [], eos)[0] for p in prompts]
    assert batched[0] == free[0][: free[0].index(eos) + 1] and batched[1:] == free[1:]


def test_cut_is_at_each_stop_string_in_turn_as_the_harness_cuts():
    assert cut("a\nb.c\n", ["\n"]) == "a"
    assert cut("ab.c\nd", ["\n", "."]) == "ab"
    assert cut("abc", ["", "x"]) == "abc"
    # overlapping stop strings: their order decides, as in lm-evaluation-harness's
    # generate_until (text.split(s)[0] for each s in turn), not the earliest match
    assert cut("Answer: 42 B: x", ["B:", "42 B"]) == "Answer: 42 "
    assert cut("abc", ["bc", "ab"]) == "a"


def test_exact_match_strips_both_sides(tmp_path, wild, tok, specials):
    model, bos = wild, specials["bos"]
    ts = task(tmp_path / "a.jsonl", ANSWERS, "exact", max_new_tokens=NEW, stop=[])
    texts = _exact(model, tok, bos, ts).per_item["generated"]
    answers = [f"\t{t.strip()}  " if i % 2 else "no such text" for i, t in enumerate(texts)]
    items = tuple(
        dataclasses.replace(it, answer=a, choices=(a,))
        for it, a in zip(ts.items, answers, strict=True)
    )
    result = _exact(model, tok, bos, dataclasses.replace(ts, items=items))
    assert result.per_item["exact_match"] == [float(i % 2) for i in range(len(ANSWERS))]
    assert result.metrics["task/t/exact_match"] == pytest.approx(3 / 6)


def test_exact_tasks_need_a_decoder_model_and_room_to_generate(tmp_path, wild, tok, specials):
    model = wild
    ts = task(tmp_path / "a.jsonl", ANSWERS, "exact", max_new_tokens=NEW)
    with pytest.raises(ValueError, match="exact task: generation needs the plain model"):
        score_task(model, ts, tok, specials["bos"], seq_len=SEQ)
    with pytest.raises(ValueError, match="max_new_tokens 6 leaves no room"):
        _exact(model, tok, specials["bos"], ts, seq_len=NEW)


def test_generations_split_over_two_ranks_sum_to_one_process(tmp_path, wild, tok, specials):
    model, bos = wild, specials["bos"]
    ts = task(tmp_path / "a.jsonl", ANSWERS, "exact", max_new_tokens=NEW, stop=[])
    one = _exact(model, tok, bos, ts)
    seen: dict[int, torch.Tensor] = {}

    def keep(x: torch.Tensor, r: int) -> torch.Tensor:
        assert x.dtype == torch.float64 and x.dim() == 1 and x.device.type == "cpu"
        return seen.setdefault(r, x.clone())

    for r in (0, 1):
        _exact(model, tok, bos, ts, ranks=Ranks(r, 2, all_reduce=lambda x, r=r: keep(x, r)))
    tables = {r: seen[r].reshape(len(ANSWERS), NEW) for r in (0, 1)}  # (items, tokens)
    for r in (0, 1):  # each rank its own items (r::2), zeros elsewhere
        assert tables[r][r::2].count_nonzero() > 0 and tables[r][1 - r :: 2].count_nonzero() == 0
    for r in (0, 1):
        both = _exact(
            model, tok, bos, ts, ranks=Ranks(r, 2, all_reduce=lambda x, r=r: x + seen[1 - r])
        )
        assert both.per_item == one.per_item
        assert both.metrics == pytest.approx(one.metrics, nan_ok=True)
