"""Evaluation through the chunked head: each target's loss is the plain logits' cross
entropy, no tensor near the (B, T, V) logits is made, and the validation batches are put
on the device once per run."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ledgerlm.config import EvalConfig, ModelConfig, TrainConfig
from ledgerlm.model import gpt, head_loss
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train import evaluate as evaluation
from ledgerlm.train.evaluate import EvalCallback, evaluate
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer

V, SEQ, ROWS = 512, 64, 8
DOMAINS = ["a", "b"]


def _model(dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    # a wide init: the targets' losses differ, so a loss summed to the wrong target shows
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, init_std=0.5)
    return GPT(cfg, V).to(dtype).eval()


def _rows(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    docs = [
        (rng.integers(3, V, size=rng.integers(2, 40)), int(rng.integers(2))) for _ in range(9 * n)
    ]
    rows = list(pack_documents(docs, SEQ + 1, 1, 2, 0))
    assert len(rows) >= n
    return rows[:n]


def _val(n_batches: int = 2) -> list:
    return list(batches(_rows(ROWS * n_batches), ROWS))


def _plain(model: GPT, val: list) -> dict[str, float]:
    """Per-domain token-mean losses from the whole logits and ``F.cross_entropy``."""
    total, count = np.zeros(2), np.zeros(2)
    with torch.no_grad():
        for b in val:
            logits = model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"))
            ce = F.cross_entropy(logits.flatten(0, 1), b.targets.flatten(), reduction="none")
            keep = b.loss_mask.flatten()
            np.add.at(total, b.target_domains.flatten()[keep].numpy(), ce[keep].double().numpy())
            np.add.at(count, b.target_domains.flatten()[keep].numpy(), 1)
    return {
        "loss": total.sum() / count.sum(),
        **{f"loss/{d}": total[i] / count[i] for i, d in enumerate(DOMAINS)},
    }


@pytest.fixture
def small_chunks(monkeypatch):
    """64-row chunks of the head: a validation batch (512 rows) takes 8."""
    monkeypatch.setattr(head_loss, "HEAD_CHUNK_BYTES", 64 * 4 * V)


@pytest.mark.parametrize(("dtype", "rel"), [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_an_evaluation_gives_the_cross_entropy_of_the_whole_logits(small_chunks, dtype, rel):
    model, val = _model(dtype), _val()
    got, expected = evaluate(model, val, "isolated", DOMAINS), _plain(model, val)
    assert got.keys() == expected.keys()
    assert len({round(v, 3) for v in expected.values()}) == 3  # the domains differ
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=rel), name


def test_per_target_losses_under_bf16_are_those_of_the_bf16_logits(small_chunks):
    """Under autocast the head's matmul runs in bf16, as the plain head's does, and the
    softmax in fp32: the same losses as the upcast bf16 logits to fp32 rounding."""
    model, b = _model(), _val(1)[0]
    mask = attention_mask(b.doc_ids, "isolated")
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        logits = model(b.input_ids, b.position_ids, mask)
        losses = model(b.input_ids, b.position_ids, mask, targets=b.targets)
    assert logits.dtype == torch.bfloat16 and losses.dtype == torch.float32
    plain = F.cross_entropy(logits.flatten(0, 1).float(), b.targets.flatten(), reduction="none")
    assert torch.allclose(losses.flatten(), plain, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        fp32 = model(b.input_ids, b.position_ids, mask, targets=b.targets)
    assert not torch.allclose(losses, fp32, rtol=1e-4, atol=0)  # bf16 really ran


def test_per_target_losses_need_no_gradient():
    """A training forward must pass its weights; per-target losses are for evaluation."""
    model, b = _model(), _val(1)[0]
    with pytest.raises(ValueError, match="weights"):
        model(b.input_ids, b.position_ids, attention_mask(b.doc_ids, "isolated"), targets=b.targets)


class Largest(TorchDispatchMode):
    """The most elements of any tensor an op returns while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.numel = max([self.numel, *sizes])
        return out


def _largest_and_head_calls(model: GPT, val: list) -> tuple[int, int]:
    calls = []
    hook = model.lm_head.register_forward_hook(lambda *_: calls.append(1))
    try:
        with Largest() as largest:
            evaluate(model, val, "isolated", DOMAINS)
    finally:
        hook.remove()
    return largest.numel, len(calls)


def test_an_evaluation_makes_no_tensor_near_the_whole_logits(small_chunks):
    """The largest tensor any op makes is a chunk of logits (64 rows) or the attention's
    (B, nh, T, T) scores, a quarter of B x T x V at most; the head module, which would
    return the whole logits, is never called."""
    largest, head_calls = _largest_and_head_calls(_model(), _val())
    assert head_calls == 0
    assert largest <= ROWS * SEQ * V // 4, largest


def test_the_memory_check_sees_an_evaluation_that_makes_the_whole_logits(small_chunks, monkeypatch):
    """Mutation check: per-target losses taken from the whole logits fail the bound."""

    def whole(x, weight, targets):
        logits = (x @ weight.t()).float()  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")

    monkeypatch.setattr(gpt, "head_losses", whole)
    largest, _ = _largest_and_head_calls(_model(), _val())
    assert largest >= ROWS * SEQ * V


class _Placements:
    """Counts ``placed`` calls (the validation batches put on the device)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = 0
        real = evaluation.placed

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(evaluation, "placed", counted)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_validation_batches_are_placed_once_per_run(monkeypatch, asynchronous):
    placements = _Placements(monkeypatch)
    val = _val(1)
    cfg = EvalConfig(every_steps=1, target_loss=0.1, asynchronous=asynchronous)
    evaluator = EvalCallback(val, cfg, "isolated", DOMAINS)
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layers=1, n_heads=2), V)
    train = TrainConfig(max_steps=3, micro_batch_rows=4, warmup_steps=0)
    data = iter(batches(_rows(12, seed=1), 4))
    Trainer(model, build_optimizer(model, train), train, data, "isolated", [evaluator]).fit()
    assert [e["step"] for e in evaluator.history] == [1, 2, 3]
    assert placements.calls == 1
    # and the kept batches give what a fresh placement gives
    assert evaluator.history[-1]["metrics"] == evaluate(model, val, "isolated", DOMAINS)


def test_a_test_split_scored_in_chunks_gives_what_it_gives_at_once(monkeypatch):
    """``chunk`` places that many batches on the device at a time (the test split):
    the sums go on over the chunks, so the figures are bitwise those of one placement,
    and no placement holds more than ``chunk`` batches."""
    model, val = _model(), _val(5)
    whole = evaluate(model, val, "isolated", DOMAINS)
    placements = _Placements(monkeypatch)
    sizes = []
    real = evaluation.Scoring.then
    monkeypatch.setattr(
        evaluation.Scoring,
        "then",
        lambda self, share: (sizes.append(len(share.mine)), real(self, share)),
    )
    assert evaluate(model, val, "isolated", DOMAINS, chunk=2) == whole
    assert placements.calls == 3 and sizes == [2, 1]  # 2 + 2 + 1 batches
