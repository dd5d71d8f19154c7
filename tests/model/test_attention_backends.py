"""Attention backends: one predicate, three kernels (masked SDPA, flex_attention, causal SDPA).

The CPU checks compare flex's document predicate with the SDPA mask on packed rows
with padding, and flex's (eager, forward-only) CPU kernel with masked SDPA. The
CUDA test runs only where a GPU is present.
"""

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask

from ledgerlm.config import ModelConfig, RecipeError, recipe_from_dict
from ledgerlm.model.attention import (
    attend,
    attention_mask,
    attention_spec,
    choose_backend,
    document_mask_mod,
)
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import Batch, batches, pack_documents

V = 50
EAGER_FLEX = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _packed(seq_len: int, rows: int, seed: int = 0, reset: bool = True) -> Batch:
    """``rows`` packed rows of random documents; the last row ends in padding."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, seq_len // 3, size=200)
    docs, held = [], 0
    while held < (rows - 1) * (seq_len + 1) + seq_len // 2:  # the last row is half full
        ids = rng.integers(3, V, size=sizes[len(docs)])
        docs.append((ids, 0))
        held += len(ids) + 2
    packed = list(pack_documents(docs, seq_len + 1, 1, 2, 0))
    assert len(packed) == rows and not packed[-1][3].all()
    return next(batches(packed, rows, reset))


def _model(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2).model_copy(update=kw)
    return GPT(cfg, V).eval()


@pytest.mark.parametrize(
    ("device", "mode", "requested", "head_dim", "kind"),
    [
        ("cpu", "isolated", "auto", 16, "sdpa"),
        ("cpu", "cross", "auto", 16, "sdpa"),
        ("cuda", "isolated", "auto", 16, "flex"),
        ("cuda", "cross", "auto", 16, "causal"),
        ("cuda", "isolated", "auto", 8, "sdpa"),  # too narrow for flex's kernels
        ("cuda", "cross", "auto", 8, "causal"),
        ("cuda", "isolated", "sdpa", 16, "sdpa"),
        ("cuda", "cross", "sdpa", 16, "sdpa"),
        ("cpu", "isolated", "flex", 16, "flex"),
        ("cpu", "cross", "flex", 16, "causal"),
        ("cuda:1", "isolated", "auto", None, "flex"),
        ("mps", "isolated", "auto", 16, "sdpa"),
    ],
)
def test_backend_decision(device, mode, requested, head_dim, kind):
    assert choose_backend(torch.device(device), mode, requested, head_dim) == kind


def test_backend_decision_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown attention mode"):
        choose_backend("cpu", "sideways")
    with pytest.raises(ValueError, match="unknown attention backend"):
        choose_backend("cuda", "isolated", "xformers")


def test_recipe_option():
    assert ModelConfig().attention_backend == "auto"
    for name in ("auto", "sdpa", "flex"):
        assert recipe_from_dict({"model": {"attention_backend": name}}).model.attention_backend == (
            name
        )
    with pytest.raises(RecipeError, match=r"model\.attention_backend"):
        recipe_from_dict({"model": {"attention_backend": "xformers"}}, "r.toml")


def test_specs_on_cpu():
    b = _packed(24, 3)
    for mode in ("isolated", "cross"):
        spec = attention_spec(b.doc_ids, mode)  # auto on CPU: the explicit mask, unchanged
        assert spec.kind == "sdpa" and spec.block_mask is None
        assert torch.equal(spec.mask, attention_mask(b.doc_ids, mode))
    assert attention_spec(b.doc_ids, "cross", "flex").kind == "causal"
    with pytest.raises(RuntimeError, match="cannot train on CPU"):
        attention_spec(b.doc_ids, "isolated", "flex")
    with torch.no_grad():
        spec = attention_spec(b.doc_ids, "isolated", "flex")
        assert spec.kind == "flex" and isinstance(spec.block_mask, BlockMask)
        assert spec.block_mask.shape == (3, 1, 24, 24)
        with pytest.raises(RuntimeError, match="head_dim >= 16"):
            attention_spec(b.doc_ids, "isolated", "flex", head_dim=8)
    model = _model(attention_backend="sdpa")
    assert model.attention_spec(b.doc_ids, "isolated").kind == "sdpa"


@pytest.mark.parametrize(("seq_len", "rows", "seed"), [(16, 2, 0), (40, 4, 1), (150, 3, 2)])
def test_document_predicate_equals_the_sdpa_mask(seq_len, rows, seed):
    b = _packed(seq_len, rows, seed)
    mask_mod = document_mask_mod(b.doc_ids)
    idx = torch.arange(seq_len)
    allowed = mask_mod(
        torch.arange(rows)[:, None, None], torch.zeros((), dtype=torch.long), idx[:, None], idx
    )  # every (row, q, kv) at once: (B, T, T)
    expected = attention_mask(b.doc_ids, "isolated")[:, 0]
    assert torch.equal(allowed, expected)
    assert torch.equal(create_mask(mask_mod, rows, 1, seq_len, seq_len, "cpu")[:, 0], expected)
    # padding: no real query reads a padding key, and every position reads itself
    real_q_pad_kv = b.valid[:, :, None] & ~b.valid[:, None, :]
    assert not (allowed & real_q_pad_kv).any()
    assert allowed.diagonal(dim1=1, dim2=2).all()


@EAGER_FLEX
@pytest.mark.parametrize(("seq_len", "rows"), [(40, 3), (150, 2)])
def test_flex_forward_on_cpu_equals_masked_sdpa(seq_len, rows):
    b = _packed(seq_len, rows, seed=seq_len)
    with torch.no_grad():
        flex = attention_spec(b.doc_ids, "isolated", "flex")
        q, k, v = torch.randn(3, rows, 2, seq_len, 16, generator=torch.Generator().manual_seed(0))
        ref = attend(q, k, v, attention_mask(b.doc_ids, "isolated"))
        # flex and SDPA are different fp32 kernels, each summing in its own order: ~100
        # ulps of these O(1) values, here and below, not bitwise
        torch.testing.assert_close(attend(q, k, v, flex), ref, atol=1e-5, rtol=1e-5)
        model = _model()
        ref = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
        out = model(b.input_ids, b.position_ids, flex)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_causal_backend_equals_the_cross_mask_and_trains_on_cpu():
    b = _packed(40, 3, reset=False)
    model = _model()
    ref = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "cross"))
    out = model(b.input_ids, b.position_ids, attention_spec(b.doc_ids, "cross", "flex"))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_the_mask_tensor_path_is_unchanged():
    """A bare bool mask and the auto spec on CPU run the same SDPA call: identical bits."""
    b = _packed(40, 3)
    model = _model()
    with torch.no_grad():
        old = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
        new = model(b.input_ids, b.position_ids, model.attention_spec(b.doc_ids, "isolated"))
    assert torch.equal(old, new)


def test_spec_traces_through_dynamo():
    b = _packed(24, 2)
    model = _model()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    for mode, backend in (("isolated", "auto"), ("cross", "flex")):
        spec = attention_spec(b.doc_ids, mode, backend)
        with torch.no_grad():
            ref = model(b.input_ids, b.position_ids, spec)
            torch.testing.assert_close(compiled(b.input_ids, b.position_ids, spec), ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flex_on_cuda_packed_equals_separate_and_trains():
    dev = torch.device("cuda")
    model = _model(d_model=64, n_heads=4).to(dev)  # head_dim 16: flex's minimum
    docs = [3 + np.arange(n) % (V - 3) for n in (40, 7, 90, 1, 20)]
    row = next(pack_documents([(d, 0) for d in docs], 129, 1, 2, 0))
    b = next(batches([row], 1))
    ids, pos, doc_ids = b.input_ids.to(dev), b.position_ids.to(dev), b.doc_ids.to(dev)
    with torch.no_grad():
        spec = model.attention_spec(doc_ids, "isolated")
        assert spec.kind == "flex"
        packed = model(ids, pos, spec)
        masked = model(ids, pos, attention_mask(doc_ids, "isolated"))
        torch.testing.assert_close(packed, masked, atol=1e-5, rtol=1e-5)
        start = 0
        for d in docs:
            alone = torch.tensor([[1, *d.tolist(), 2]], device=dev)
            n = min(alone.shape[1], 128 - start)
            if n <= 0:
                break
            one = model.attention_spec(torch.zeros_like(alone), "isolated")
            ref = model(alone, torch.arange(alone.shape[1], device=dev)[None], one)
            torch.testing.assert_close(
                packed[0, start : start + n], ref[0, :n], atol=1e-5, rtol=1e-5
            )
            start += alone.shape[1]
        cross = model(ids, pos, model.attention_spec(doc_ids, "cross"))
        ref = model(ids, pos, attention_mask(doc_ids, "cross"))
        torch.testing.assert_close(cross, ref, atol=1e-5, rtol=1e-5)

    # one training step through flex: finite loss, gradients equal to the masked path's
    model.train()
    grads = []
    for attn in (model.attention_spec(doc_ids, "isolated"), attention_mask(doc_ids, "isolated")):
        model.zero_grad(set_to_none=True)
        logits = model(ids, pos, attn)
        loss = torch.nn.functional.cross_entropy(
            logits[b.loss_mask.to(dev)], b.targets.to(dev)[b.loss_mask.to(dev)]
        )
        loss.backward()
        assert loss.isfinite()
        grads.append([p.grad.clone() for p in model.parameters()])
    for g_flex, g_sdpa in zip(*grads, strict=True):
        torch.testing.assert_close(g_flex, g_sdpa, atol=1e-5, rtol=1e-4)
    before = [p.detach().clone() for p in model.parameters()]
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
