"""Cached decoding computes what a full forward computes, and the FLOPs of a generated
token are the hand count."""

from __future__ import annotations

import pytest
import torch

from ledgerlm.config import ModelConfig
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.decode import (
    Decoder,
    flops_per_token,
    full_logits,
    generate,
    generate_uncached,
)
from ledgerlm.model.gpt import GPT

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)
V = 50
ATOL = 1e-5


def _model(seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(CFG.model_copy(update=kw), V).eval()


def _forward(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """``GPT.forward`` on the CPU's SDPA path with an explicit mask, one document a row."""
    b, t = ids.shape
    positions = torch.arange(t).expand(b, t)
    with torch.no_grad():
        return model(ids, positions, attention_mask(torch.zeros(b, t, dtype=torch.long), "cross"))


def test_cached_decode_equals_a_full_forward_step_by_step():
    model = _model()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (2, 12 + 6), generator=g)  # batch 2, context 12, 6 steps
    full = _forward(model, ids)  # (2, 18, V)
    decoder = Decoder(model, ids.shape[1])
    prefill = decoder(ids[:, :12])
    torch.testing.assert_close(prefill, full[:, :12], atol=ATOL, rtol=0)
    for pos in range(12, 18):
        step = decoder(ids[:, pos : pos + 1])  # (2, 1, V) over the cache
        assert step.shape == (2, 1, V) and decoder.length == pos + 1
        torch.testing.assert_close(step[:, 0], full[:, pos], atol=ATOL, rtol=0)


def test_chunks_of_several_tokens_after_a_prefill_are_masked_causally():
    model = _model(seed=3)
    ids = torch.randint(0, V, (2, 15), generator=torch.Generator().manual_seed(2))
    full = _forward(model, ids)
    decoder = Decoder(model, 15)
    got = torch.cat([decoder(ids[:, a:b]) for a, b in ((0, 5), (5, 9), (9, 10), (10, 15))], 1)
    torch.testing.assert_close(got, full, atol=ATOL, rtol=0)


def test_greedy_generation_with_and_without_the_cache_agree():
    model = _model(seed=5, tie_embeddings=False)
    context = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(4))
    cached = generate(model, context, 8)
    assert cached.shape == (2, 15) and torch.equal(cached[:, :7], context)
    assert torch.equal(cached, generate_uncached(model, context, 8))
    # every generated token is the argmax of the full forward over what precedes it
    logits = full_logits(model, cached)
    assert torch.equal(logits[:, 6:-1].argmax(-1), cached[:, 7:])


def test_the_cache_refuses_to_overflow_or_change_batch():
    model = _model()
    decoder = Decoder(model, 4)
    decoder(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="batch of 3 rows"):
        decoder(torch.zeros(3, 1, dtype=torch.long))
    decoder(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="overflows the cache"):
        decoder(torch.zeros(2, 1, dtype=torch.long))
    assert decoder.k is not None and decoder.k.shape == (2, 2, 4, 4, 8)  # (L, B, nh, max, hs)


def test_flops_per_token_by_hand():
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2)
    # hidden = 16 * ceil(8/3 * 16 / 16) = 48
    q_k_v_o = 4 * 16 * 16
    swiglu = 3 * 16 * 48
    norms = 2 * 16 + 16  # two per block, the final one (counted in N, as scaling does)
    head = 16 * 32
    n = q_k_v_o + swiglu + norms + head
    assert n == 3888
    f = flops_per_token(cfg, 32, context=10)
    assert n == f.N and f.matmul == 2 * n
    # QK^T: 10 dot products of length 16 over both heads (2 * 10 * 16); AV the same
    assert f.attention == 2 * 10 * 16 + 2 * 10 * 16 == 640
    assert f.total == 7776 + 640 and f.per_param == pytest.approx(8416 / 3888)
    assert flops_per_token(cfg, 32, context=0).per_param == pytest.approx(2.0)
    # grows with the context by exactly 4 n_layers d per position
    deeper = ModelConfig(d_model=16, n_layers=3, n_heads=2)
    step = flops_per_token(deeper, 32, 101).total - flops_per_token(deeper, 32, 100).total
    assert step == 4 * 3 * 16
    with pytest.raises(ValueError, match="context"):
        flops_per_token(cfg, 32, -1)
