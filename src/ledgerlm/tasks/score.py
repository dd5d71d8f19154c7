"""A task's items scored on a model: ``choice`` and ``bpb`` by log-likelihood, ``exact``
by greedy generation (``generate``), with the standard errors of ``stats``.

Tokens follow lm-evaluation-harness (``encoding``: the context's trailing whitespace
moves to the continuation, the pair is encoded whole, and the continuation's tokens are
the whole's after the context's own count). Every request starts with ``bos``, as
training documents do (the harness gets the same from the exported model's tokenizer,
``add_bos_token``), and a request longer than ``seq_len + 1`` tokens is cut from the
left: ``(bos + whole)[-(seq_len + 1):]``, the input its tokens but the last, the targets
the next ones. An item's log-likelihood for a continuation is the sum of the targets'
log-probabilities over the continuation's tokens.

Requests (one per item and continuation) run longest first, ``rows`` to a batch,
right-padded to ``rows`` rows and a power-of-two width (``width``: few shapes for a
compiled model); padding has a document id of its own (-1, as in packing) so no real
token attends to it, and its targets are never read. The model is called as the trainer's
evaluation calls it (``model(ids, positions, model.attention_spec(doc_ids,
"isolated"), targets=)``): per-target nats through the chunked head, never the (B, T, V)
logits, so the DDP engine or an FSDP root serves as well as a plain ``GPT``. Sums are
float64; autocast is the caller's.

Under ``torchrun`` rank r scores items r::size; every per-item figure is written into a
zero-filled vector as long as the task and the vectors are summed over ranks
(``Ranks.all_reduce``), so every rank computes the metrics from every item, the same as
one process. With a sharded model (FSDP gathers weights in each forward, a collective)
every rank runs as many forwards as the rank with the most batches, a rank short of
them a spare batch whose result is dropped, as ``train.evaluate.placed`` does for the
validation batches. Each rank can count every rank's batches from the items alone, so
that costs no communication.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from ledgerlm.model.gpt import GPT
from ledgerlm.tasks import stats
from ledgerlm.tasks.encoding import encode_pair, split_pair
from ledgerlm.tasks.generate import generate_ids, text_of
from ledgerlm.tasks.items import Item, TaskSet


@dataclass(frozen=True)
class Ranks:
    """How a task's items are split over ranks (``tasks`` may not import ``train.World``)."""

    rank: int = 0
    size: int = 1
    sharded: bool = False  # FSDP: every rank must run the same number of forwards
    # the sum over ranks of a flat float64 CPU tensor (in: this rank's, out: the sum)
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None

    def mine(self, n: int) -> range:
        """The indices of ``n`` items this rank scores."""
        return range(self.rank, n, self.size)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """A float64 CPU tensor summed over the ranks (itself in one process); the
        all_reduce gets and gives it flat (1-D)."""
        if self.size == 1:
            return x
        if self.all_reduce is None:
            raise ValueError(f"{self.size} ranks need an all_reduce to sum their items")
        return self.all_reduce(x.reshape(-1)).reshape(x.shape)


@dataclass(frozen=True)
class TaskResult:
    """A task scored: its flat metrics (``task/<name>/<metric>`` and their stderr,
    interval and item count), the item-level scores behind them, and its seconds."""

    name: str
    kind: str
    metrics: dict[str, float]
    per_item: dict[str, list]
    seconds: float


@dataclass(frozen=True)
class Request:
    """One continuation of one item: its tokens (BOS, context, continuation; cut from the
    left to ``seq_len + 1``) and how many of the last ones are the continuation's."""

    index: int  # position in the task's flat list of continuations
    tokens: tuple[int, ...]
    scored: int


def no_tokens_of_its_own(item: Item, j: int) -> str:
    """Why continuation ``j`` of ``item`` cannot be scored: encoded after its context it
    has no token of its own (a merge spans the boundary, as "hel" + "lo" or "42" after
    "= 4"), so its log-likelihood would be 0 (probability 1) and it would win every
    comparison. lm-evaluation-harness refuses such a request too (an assertion)."""
    which = f"choice {j}" if len(item.choices) > 1 else "the answer"
    which += f" ({item.choices[j]!r})"
    return (
        f"{which} has no token of its own after the context (a token spans the two); "
        "set the task's delimiter (a space, a newline) between them"
    )


def requests(
    items: Sequence[Item], tokenizer: Tokenizer, bos: int | None, seq_len: int, mine: range
) -> list[Request]:
    """The requests of the items at ``mine``, each with its flat index over all items."""
    offsets = np.cumsum([0] + [len(it.continuations) for it in items])
    out = []
    for i in mine:
        item = items[i]
        for j, continuation in enumerate(item.continuations):
            ctx, cont = encode_pair(tokenizer, item.context, continuation)
            head = [bos] if bos is not None else []
            if not head and not ctx:
                raise ValueError(
                    f"line {item.line}: an empty context needs a BOS token to condition on"
                )
            if not cont:
                raise ValueError(f"line {item.line}: {no_tokens_of_its_own(item, j)}")
            if len(cont) > seq_len:
                raise ValueError(
                    f"line {item.line}: a continuation of {len(cont)} tokens does not fit "
                    f"seq_len {seq_len}"
                )
            tokens = (head + ctx + cont)[-(seq_len + 1) :]
            out.append(Request(int(offsets[i]) + j, tuple(tokens), len(cont)))
    return out


def batches(reqs: Sequence[Request], rows: int) -> list[list[Request]]:
    """Longest first (ties in item order), ``rows`` requests to a batch."""
    order = sorted(reqs, key=lambda r: (-len(r.tokens), r.index))
    return [order[i : i + rows] for i in range(0, len(order), rows)]


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


MIN_WIDTH = 64  # the narrowest batch: shorter requests are padded to it


def width(longest: int, seq_len: int, static: bool = False) -> int:
    """A batch's positions: its longest input rounded up to a power of two (at least
    ``MIN_WIDTH``, at most ``seq_len``), so a model sees a few shapes per run, not one per
    request length; ``static``: always ``seq_len``, the one shape a compiled model
    (``train.compile``: whole-graph blocks, static shapes) was compiled for, where each
    further shape would be another compile up to torch's recompile limit."""
    if static:
        return seq_len
    return min(seq_len, max(MIN_WIDTH, 1 << (longest - 1).bit_length()))


@torch.no_grad()
def loglikelihoods(
    model: torch.nn.Module,
    batch: Sequence[Request],
    rows: int,
    seq_len: int,
    static: bool = False,
) -> torch.Tensor:
    """(len(batch),) float64 summed log-likelihoods of each request's continuation, on
    the model's device: one forward of ``rows`` rows, right-padded to ``width``."""
    device = device_of(model)
    t = width(max(len(r.tokens) for r in batch) - 1, seq_len, static)
    ids = torch.zeros(rows, t + 1, dtype=torch.long)
    docs = torch.full((rows, t), -1, dtype=torch.long)
    scored = torch.zeros(rows, t, dtype=torch.bool)
    for row, r in enumerate(batch):
        n = len(r.tokens) - 1
        ids[row, : n + 1] = torch.tensor(r.tokens)
        docs[row, :n] = 0
        scored[row, n - r.scored : n] = True
    ids, docs, scored = (x.to(device, non_blocking=True) for x in (ids, docs, scored))
    positions = torch.arange(t, device=device).expand(rows, t)
    mask = model.attention_spec(docs, "isolated")
    nats = model(ids[:, :-1], positions, mask, targets=ids[:, 1:])  # (rows, t)
    return -torch.where(scored, nats.double(), 0.0).sum(dim=1)[: len(batch)]


def rounds(items: Sequence[Item], ranks: Ranks, rows: int) -> int:
    """The forwards every rank runs under a sharded model: the most batches of any rank."""
    per_rank = (
        sum(len(it.continuations) for it in items[r :: ranks.size]) for r in range(ranks.size)
    )
    return max(-(-n // rows) for n in per_rank)


def score_loglikelihoods(
    model: torch.nn.Module,
    task: TaskSet,
    tokenizer: Tokenizer,
    bos: int | None,
    *,
    seq_len: int,
    rows: int,
    ranks: Ranks,
    static: bool = False,
) -> np.ndarray:
    """Every continuation's log-likelihood (flat, item by item), the same on every rank."""
    items = task.items
    work = batches(requests(items, tokenizer, bos, seq_len, ranks.mine(len(items))), rows)
    runs = rounds(items, ranks, rows) if ranks.sharded else len(work)
    spare = None
    if runs > len(work):  # a spare batch keeps a short rank in step; its result is dropped
        spare = (
            work[0]
            if work
            else batches(requests(items, tokenizer, bos, seq_len, range(1)), rows)[0]
        )
    device = device_of(model)
    found = torch.zeros(
        sum(len(it.continuations) for it in items), dtype=torch.float64, device=device
    )
    for k in range(runs):
        batch = work[k] if k < len(work) else spare
        ll = loglikelihoods(model, batch, rows, seq_len, static)
        if k < len(work):
            found.index_add_(0, torch.tensor([r.index for r in batch], device=device), ll)
    return ranks.sum(found.cpu()).numpy()


def score_task(
    model: torch.nn.Module,
    task: TaskSet,
    tokenizer: Tokenizer,
    bos: int | None,
    *,
    seq_len: int,
    rows: int = 16,
    ranks: Ranks = Ranks(),
    decoder_model: GPT | None = None,
    eos: int | None = None,
    static: bool = False,
) -> TaskResult:
    """Score one task's items (module doc) -> its metrics, item scores and seconds.

    ``model`` is what the trainer evaluates with; ``decoder_model`` the plain ``GPT``
    that ``exact`` tasks generate with (the KV-cache ``Decoder`` needs its modules), and
    ``eos`` the token that ends a generation as a stop string does; ``static`` pads every
    batch to ``seq_len`` (``width``: a compiled model). The model is put in eval mode and
    given back in the mode it had.
    """
    if rows < 1:
        raise ValueError(f"rows {rows} must be >= 1")
    if seq_len < 1:
        raise ValueError(f"seq_len {seq_len} must be >= 1")
    start = time.perf_counter()
    kind, prefix = task.kind, f"task/{task.name}/"
    was_training = model.training
    model.eval()
    try:
        if kind == "exact":
            metrics, per_item = _exact(
                task,
                tokenizer,
                bos,
                decoder_model,
                seq_len=seq_len,
                rows=rows,
                ranks=ranks,
                eos=eos,
            )
        else:
            ll = score_loglikelihoods(
                model,
                task,
                tokenizer,
                bos,
                seq_len=seq_len,
                rows=rows,
                ranks=ranks,
                static=static,
            )
            scores = choice_scores if kind == "choice" else bpb_scores
            metrics, per_item = scores(task.items, ll, prefix)
    finally:
        model.train(was_training)
    metrics[f"{prefix}items"] = float(len(task.items))
    return TaskResult(task.name, kind, metrics, per_item, time.perf_counter() - start)


def choice_scores(items: Sequence[Item], ll: np.ndarray, prefix: str):
    """acc and acc_norm by the harness's rules (``np.argmax``: the first of a tie)."""
    per_item: dict[str, list] = {"acc": [], "acc_norm": [], "loglik": []}
    offset = 0
    for item in items:
        lls = ll[offset : offset + len(item.choices)]
        offset += len(item.choices)
        lengths = np.array([float(len(c)) for c in item.choices])
        per_item["acc"].append(float(np.argmax(lls) == item.gold))
        per_item["acc_norm"].append(float(np.argmax(lls / lengths) == item.gold))
        per_item["loglik"].append([float(x) for x in lls])
    metrics = {}
    for m in ("acc", "acc_norm"):
        metrics.update(stats.accuracy(per_item[m], prefix + m))
    return metrics, per_item


def _exact(
    task: TaskSet,
    tokenizer: Tokenizer,
    bos: int | None,
    decoder_model: GPT | None,
    *,
    seq_len: int,
    rows: int,
    ranks: Ranks,
    eos: int | None,
):
    """exact_match of greedy generations (``generate``), every item's on every rank."""
    if decoder_model is None:
        raise ValueError(
            f"task {task.name!r} is an exact task: generation needs the plain model for the "
            "KV-cache decoder (decoder_model), and none was given (a sharded model has none)"
        )
    mine = ranks.mine(len(task.items))
    table = generate_ids(
        decoder_model, task, tokenizer, bos, seq_len=seq_len, rows=rows, mine=mine, eos=eos
    )
    ids = [[int(x) - 1 for x in row if x > 0] for row in ranks.sum(table).tolist()]
    generated = [text_of(i, tokenizer, task.cfg.stop, eos) for i in ids]
    matches = [
        float(g.strip() == it.answer.strip()) for g, it in zip(generated, task.items, strict=True)
    ]
    metrics = stats.accuracy(matches, f"task/{task.name}/exact_match")
    return metrics, {"exact_match": matches, "generated": generated, "generated_ids": ids}


def bpb_scores(items: Sequence[Item], ll: np.ndarray, prefix: str):
    """Bits per UTF-8 byte of each gold continuation as scored (whitespace moved)."""
    nats = [float(-x) for x in ll]
    nbytes = [
        float(len(split_pair(it.context, it.continuations[0])[1].encode("utf-8"))) for it in items
    ]
    metrics = stats.bootstrap(nats, nbytes, prefix + "bpb")
    return metrics, {"bpb_nats": nats, "bytes": nbytes}


def score_tasks(
    model: torch.nn.Module,
    tasks: Sequence[TaskSet],
    tokenizer: Tokenizer,
    bos: int | None,
    *,
    seq_len: int,
    rows: int = 16,
    ranks: Ranks = Ranks(),
    decoder_model: GPT | None = None,
    eos: int | None = None,
    static: bool = False,
) -> tuple[dict[str, float], dict[str, float]]:
    """Every task scored -> (their metrics merged, seconds per task name)."""
    metrics: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for task in tasks:
        result = score_task(
            model,
            task,
            tokenizer,
            bos,
            seq_len=seq_len,
            rows=rows,
            ranks=ranks,
            decoder_model=decoder_model,
            eos=eos,
            static=static,
        )
        metrics.update(result.metrics)
        seconds[result.name] = result.seconds
    return metrics, seconds
