"""A position's logits read only what the attention mask allows: its own document's
past (``isolated``) or the row's past (``cross``), in fp32, under bf16 autocast and
compiled.

Each check changes one token per row and asks which positions' logits moved at all
(bitwise). Forbidden positions must not move by a single bit, in bf16 as in fp32:
a masked key's score is -inf and exp(-inf) is exactly 0, so the key adds an exact 0 to
the softmax sum and to the weighted values, and every other op (norms, projections,
RoPE, MLP, head) works on each position alone with the same kernels on the same
shapes. bf16 rounds every intermediate, but rounding is a function of the bits it is
given: equal inputs, equal outputs. An allowance of one bf16 ulp would only let a
small leak through. (A leak smaller than the rounding vanishes and no test sees it.)
Compiling uses the ``aot_eager`` backend (dynamo and AOT autograd, no C++ build).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ledgerlm.config import ModelConfig
from ledgerlm.model import gpt
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import Batch, batches, pack_documents

V = 50
SEQ, ROWS = 24, 3


def _packed(seed: int = 0) -> Batch:
    """Three rows of short documents (several per row); the last row ends in padding."""
    rng = np.random.default_rng(seed)
    docs = [(rng.integers(3, V, size=rng.integers(2, 8)), 0) for _ in range(40)]
    rows = list(pack_documents(docs, SEQ + 1, 1, 2, 0))[: ROWS - 1]
    short = next(pack_documents(docs[:2], SEQ + 1, 1, 2, 0))  # a row that ends in padding
    b = next(batches([*rows, short], ROWS))
    assert not b.valid[-1].all() and all(len(set(r.tolist())) >= 3 for r in b.doc_ids)
    return b


def _model(compiled: bool) -> GPT:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layers=2, n_heads=4), V).eval()
    if compiled:
        model.compile(backend="aot_eager", dynamic=False)
    return model


def _autocast(precision: str) -> contextlib.AbstractContextManager:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def _context(doc_ids: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T query, T key): which earlier positions a query may read, written out here
    and not taken from the code under test: its row's past, and in ``isolated`` mode
    only its own document's (padding, id -1, reads only padding)."""
    t = doc_ids.shape[1]
    past = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    if mode == "cross":
        return past.expand(doc_ids.shape[0], t, t)
    return past & (doc_ids[:, :, None] == doc_ids[:, None, :])


def assert_reads_only_its_context(model, b: Batch, mode: str, precision: str, trials=6):
    """Change one real token per row, ``trials`` times: the logits that move (by any bit)
    are those of positions allowed to read the changed one, and the changed position's
    own logits do move. The first change is each row's last real token (a later
    document's: nothing before it may move), the second its first (the first
    document's: no later document may move), then random ones."""
    rng = np.random.default_rng(1)
    allowed = _context(b.doc_ids, mode)
    rows = torch.arange(ROWS)
    real = [np.flatnonzero(v) for v in b.valid.numpy()]
    changes = [[r[-1] for r in real], [r[0] for r in real]]
    changes += [[rng.choice(r) for r in real] for _ in range(trials - 2)]
    with torch.no_grad(), _autocast(precision):
        mask = model.attention_spec(b.doc_ids, mode)
        base = model(b.input_ids, b.position_ids, mask)
        assert base.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        for change in changes:
            p = torch.tensor(change)
            ids = b.input_ids.clone()
            ids[rows, p] = 3 + (ids[rows, p] - 3 + 1 + int(rng.integers(0, V - 4))) % (V - 3)
            moved = (model(ids, b.position_ids, mask) != base).any(-1)  # (B, T)
            may_move = allowed[rows, :, p]  # the queries allowed to read position p
            leaked = moved & ~may_move
            assert not leaked.any(), f"rows {rows.tolist()} changed at {p.tolist()}: {leaked}"
            assert moved[rows, p].all()


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["isolated", "cross"])
def test_logits_read_only_their_context(precision, mode):
    assert_reads_only_its_context(_model(compiled=False), _packed(), mode, precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_logits_read_only_their_context(fresh_dynamo, precision):
    model, b = _model(compiled=True), _packed()
    for mode in ("isolated", "cross"):  # same shapes: one graph serves both masks
        assert_reads_only_its_context(model, b, mode, precision)


def test_the_future_and_the_other_documents_are_what_moves():
    """The check is not vacuous: a later document reads nothing of an earlier one only
    because of the mask (``cross`` mode moves it), and an earlier position reads nothing
    of a later one only because of causality (a full mask moves it)."""
    model, b = _model(compiled=False), _packed()
    with torch.no_grad():
        ids = b.input_ids.clone()
        ids[0, 0] = 3 + (ids[0, 0] - 3 + 1) % (V - 3)  # the first document's first token
        first = b.doc_ids[0] == b.doc_ids[0, 0]
        for mode, other_docs_move in (("isolated", False), ("cross", True)):
            mask = attention_mask(b.doc_ids, mode)
            moved = model(ids, b.position_ids, mask) != model(b.input_ids, b.position_ids, mask)
            assert bool(moved[0, ~first].any()) == other_docs_move
        full = torch.ones_like(attention_mask(b.doc_ids, "cross"))
        ids = b.input_ids.clone()
        ids[0, SEQ - 1] = 3 + (ids[0, SEQ - 1] - 3 + 1) % (V - 3)
        moved = model(ids, b.position_ids, full) != model(b.input_ids, b.position_ids, full)
        assert moved.any(-1)[0, : SEQ - 1].all()


_real_attend = gpt.attend


def _leaks_under_autocast(q, k, v, attn):  # ignores the mask whenever autocast is on
    if torch.is_autocast_enabled(q.device.type):
        return F.scaled_dot_product_attention(q, k, v)
    return _real_attend(q, k, v, attn)


def _leaks_across_documents(q, k, v, attn):  # causal only: documents not isolated
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize(
    ("leak", "mode", "precision"),
    [
        (_leaks_under_autocast, "isolated", "bf16"),
        (_leaks_under_autocast, "cross", "bf16"),
        (_leaks_across_documents, "isolated", "fp32"),
        (_leaks_across_documents, "isolated", "bf16"),
    ],
)
def test_the_check_fails_for_an_attention_that_leaks(monkeypatch, leak, mode, precision):
    monkeypatch.setattr(gpt, "attend", leak)
    with pytest.raises(AssertionError, match="changed at"):
        assert_reads_only_its_context(_model(compiled=False), _packed(), mode, precision)
