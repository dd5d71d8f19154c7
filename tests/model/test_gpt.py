import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ledgerlm.config import ModelConfig
from ledgerlm.model import head_loss as head_kernel
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, make_batch, pack_documents

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)
V = 50


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(CFG.model_copy(update=kw), V).eval()


def test_block_causal_mask():
    m = attention_mask(torch.tensor([[0, 0, 1, 1, 1]]), "isolated")[0, 0].int()
    assert m.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert attention_mask(torch.tensor([[0, 0, 1]]), "cross")[0, 0].int().tolist() == [
        [1, 0, 0],
        [1, 1, 0],
        [1, 1, 1],
    ]
    with pytest.raises(ValueError, match="unknown attention mode"):
        attention_mask(torch.tensor([[0]]), "sideways")


def test_isolated_packed_row_equals_each_document_alone():
    model = _model()
    docs = [np.array([5, 6, 7, 8, 9]), np.array([10, 11, 12]), np.array([13, 14, 15, 16])]
    row = next(pack_documents([(d, 0) for d in docs], 16, 1, 2, 0))
    packed = make_batch(row[0][None], row[1][None], row[3][None])
    with torch.no_grad():
        out = model(
            packed.input_ids, packed.position_ids, attention_mask(packed.doc_ids, "isolated")
        )
        start = 0
        for d in docs:
            alone = torch.tensor([[1, *d.tolist(), 2]])
            n = min(alone.shape[1], 15 - start)
            ref = model(
                alone,
                torch.arange(alone.shape[1])[None],
                attention_mask(torch.zeros_like(alone), "isolated"),
            )
            # fp32, and attention over the packed row's 16 keys is not the same matmul as
            # over a document's own few: sums in another order, so ~100 ulps, not bitwise
            torch.testing.assert_close(out[0, start : start + n], ref[0, :n], atol=1e-5, rtol=1e-5)
            start += alone.shape[1]


def test_cross_attention_reads_across_documents():
    model = _model()
    docs = [np.array([5, 6, 7]), np.array([10, 11, 12])]
    row = next(pack_documents([(d, 0) for d in docs], 10, 1, 2, 0))
    b = make_batch(row[0][None], row[1][None], row[3][None], reset_positions=False)
    with torch.no_grad():
        iso = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
        cross = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "cross"))
    torch.testing.assert_close(iso[0, :5], cross[0, :5])  # first document: same context
    assert not torch.allclose(iso[0, 5:], cross[0, 5:])  # second: cross sees the first


def test_future_tokens_do_not_change_past_logits():
    model = _model()
    a = torch.randint(3, V, (1, 12))
    b = a.clone()
    b[0, 8:] = torch.randint(3, V, (4,))
    pos = torch.arange(12)[None]
    mask = attention_mask(torch.zeros_like(a), "isolated")
    with torch.no_grad():
        torch.testing.assert_close(model(a, pos, mask)[0, :8], model(b, pos, mask)[0, :8])


def test_tied_embeddings_share_storage_and_count_once():
    tied, untied = _model(tie_embeddings=True), _model(tie_embeddings=False)
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.num_params() - tied.num_params() == V * CFG.d_model


def test_a_model_built_on_meta_has_the_eager_weights():
    """Built without memory (``device="meta"``), then materialized: exactly the weights of
    a model built directly, tied weights tied again; each matrix from its own generator,
    so drawing another parameter first changes nothing."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2)
    torch.manual_seed(3)
    eager = GPT(cfg, 50)
    torch.manual_seed(3)
    lazy = GPT(cfg, 50, device="meta")
    assert all(p.is_meta for p in lazy.parameters())
    lazy.materialize("cpu")
    assert lazy.lm_head.weight is lazy.embed.weight
    assert eager.state_dict().keys() == lazy.state_dict().keys()
    for name, t in eager.state_dict().items():
        assert torch.equal(t, lazy.state_dict()[name]), name
    torch.manual_seed(4)
    other = GPT(cfg, 50)
    assert not torch.equal(other.embed.weight, eager.embed.weight)  # the seed matters
    assert torch.equal(other.norm.weight, torch.ones(32))
    # depth-scaled residual projections
    attn = eager.blocks[0].attn
    ratio = attn.wo.weight.detach().std() / attn.wq.weight.detach().std()
    assert float(ratio) == pytest.approx(1 / 2, rel=0.1)


def test_activation_checkpointing_recomputes_the_same_numbers():
    """Recomputing each block in the backward pass gives bitwise the same loss and
    gradients as keeping its activations."""
    cfg = ModelConfig(d_model=32, n_layers=3, n_heads=2)
    rows = list(pack_documents([(np.arange(3, 30), 0), (np.arange(5, 25), 1)], 17, 1, 2, 0))
    b = next(batches(rows, len(rows)))
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg, 40)
        model.checkpoint_blocks = recompute
        logits = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
        loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_a, a), (loss_b, g) = grads
    assert torch.equal(loss_a, loss_b)
    assert a.keys() == g.keys() and all(torch.equal(a[k], g[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_loss_is_the_weighted_cross_entropy_of_the_logits(monkeypatch, dtype):
    """``forward(..., targets=, weights=)`` scores the head in chunks (several here) and
    gives the weighted cross-entropy of the plain logits, value and gradients."""
    monkeypatch.setattr(head_kernel, "HEAD_CHUNK_BYTES", 64 * 4 * V)  # 64-row chunks: 3 of them
    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, V, size=rng.integers(2, 12)), 0) for _ in range(30)]
    b = next(batches(list(pack_documents(docs, 65, 1, 2, 0))[:3], 3))
    weights = torch.rand(b.loss_mask.shape, dtype=torch.float64) * b.loss_mask
    mask = attention_mask(b.doc_ids, "isolated")
    results = []
    for fused in (False, True):
        model = _model().to(dtype).train()
        if fused:
            out = model(b.input_ids, b.position_ids, mask, targets=b.targets, weights=weights)
        else:
            logits = model(b.input_ids, b.position_ids, mask)
            ce = F.cross_entropy(logits.flatten(0, 1), b.targets.flatten(), reduction="none")
            out = (ce * weights.flatten().to(dtype)).sum()
        out.backward()
        results.append([out.detach()] + [p.grad for p in model.parameters()])
    rel = 1e-5 if dtype == torch.float32 else 1e-12  # of each tensor's largest entry
    for plain, chunked in zip(*results, strict=True):
        assert (chunked - plain).abs().max() <= rel * plain.abs().max()


def test_head_loss_keeps_unweighted_rows_out_even_when_not_finite():
    torch.manual_seed(0)
    x = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(V, 8, requires_grad=True)
    targets = torch.randint(0, V, (10,))
    weights = torch.ones(10)
    weights[[2, 7]] = 0.0
    poisoned = torch.where(weights[:, None] > 0, x, torch.tensor(float("nan")))
    out = head_kernel.head_loss(poisoned, weight, targets, weights)
    out.backward()
    assert out.isfinite() and weight.grad.isfinite().all() and x.grad.isfinite().all()
    assert not x.grad[[2, 7]].any()
    expected = F.cross_entropy(x @ weight.t(), targets, reduction="none")[weights > 0].sum()
    torch.testing.assert_close(out, expected)
