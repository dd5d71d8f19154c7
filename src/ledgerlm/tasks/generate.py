"""``exact`` tasks: greedy generation with the KV cache and exact match after stripping.

Each item's prompt is ``bos`` and its context's tokens, cut from the left so the prompt
and ``max_new_tokens`` fit ``seq_len``. The ``Decoder`` keeps every row of a batch at
one position (no ragged prompts), so items are batched by prompt length, ``rows`` at a
time: a prefill of the prompts, then one token per row per step, greedy, until
``max_new_tokens`` or until every row has ended (produced ``eos`` or a stop string). A
row's tokens are those up to the step it ended at, whatever the rest of its batch does,
so an item's generation does not depend on the items batched with it.

The text is the generated tokens decoded alone (special tokens skipped, as the harness's
``tok_decode``), up to ``eos``, cut at each stop string in turn (``cut``, as the
harness splits it); ``exact_match`` compares it with the answer, both stripped.

The token ids come back as a zero-filled (items, max_new_tokens) float64 table of
id + 1 (0: no token) holding the items asked for (a rank's r::size), which the scorer
sums over ranks so that every rank decodes every item's text. The decoder runs no
collective, so ranks need not run in step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from ledgerlm.model.decode import Decoder
from ledgerlm.model.gpt import GPT
from ledgerlm.tasks.encoding import encode
from ledgerlm.tasks.items import TaskSet


def cut(text: str, stop: Sequence[str]) -> str:
    """``text`` cut at each (non-empty) stop string in turn, before its first
    occurrence, as lm-evaluation-harness cuts a generation: where two stop strings
    overlap ("42 B" and "B:" in "42 B: x") their order decides."""
    for s in stop:
        if s:
            text = text.split(s, 1)[0]
    return text


def _ended(ids: list[int], tokenizer: Tokenizer, stop: Sequence[str], eos: int | None) -> bool:
    if eos is not None and ids and ids[-1] == eos:
        return True
    if not any(stop):
        return False
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return any(s and s in text for s in stop)


@torch.no_grad()
def generate_batch(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    tokenizer: Tokenizer,
    stop: Sequence[str],
    eos: int | None,
) -> list[list[int]]:
    """Greedy tokens for prompts of one length, each row up to the step it ended at."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
    decoder = Decoder(model, ids.shape[1] + max_new_tokens)
    logits = decoder(ids)
    out: list[list[int]] = [[] for _ in prompts]
    open_rows = set(range(len(prompts)))
    for step in range(max_new_tokens):
        token = logits[:, -1].argmax(-1)  # (B,)
        for row, t in enumerate(token.tolist()):
            if row in open_rows:
                out[row].append(t)
                if _ended(out[row], tokenizer, stop, eos):
                    open_rows.discard(row)
        if not open_rows or step + 1 == max_new_tokens:
            break
        logits = decoder(token[:, None])
    return out


def text_of(ids: Sequence[int], tokenizer: Tokenizer, stop: Sequence[str], eos: int | None) -> str:
    """A generation's text: decoded up to ``eos``, cut at the first stop string."""
    ids = list(ids)
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return cut(tokenizer.decode(ids, skip_special_tokens=True), stop)


def generate_ids(
    model: GPT,
    task: TaskSet,
    tokenizer: Tokenizer,
    bos: int | None,
    *,
    seq_len: int,
    rows: int,
    mine: Sequence[int],
    eos: int | None = None,
) -> torch.Tensor:
    """The items at ``mine`` generated (module doc) -> a zero-filled (items,
    max_new_tokens) float64 table of id + 1, 0 where no token was generated."""
    cfg, items = task.cfg, task.items
    new = cfg.max_new_tokens
    room = seq_len - new
    if room < 1:
        raise ValueError(
            f"task {task.name!r}: max_new_tokens {new} leaves no room for a context in "
            f"seq_len {seq_len}"
        )
    head = [bos] if bos is not None else []
    by_length: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for i in mine:
        prompt = (head + encode(tokenizer, items[i].context))[-room:]
        if not prompt:
            raise ValueError(f"line {items[i].line}: an empty context needs a BOS token")
        by_length[len(prompt)].append((i, prompt))
    table = torch.zeros(len(items), new, dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for length in sorted(by_length, reverse=True):
            group = by_length[length]
            for start in range(0, len(group), rows):
                chunk = group[start : start + rows]
                prompts = [p for _, p in chunk]
                outs = generate_batch(model, prompts, new, tokenizer, cfg.stop, eos)
                for (i, _), ids in zip(chunk, outs, strict=True):
                    table[i, : len(ids)] = torch.tensor(ids, dtype=torch.float64) + 1
    finally:
        model.train(was_training)
    return table
