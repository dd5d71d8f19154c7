"""``train.precision = "bf16"`` and ``train.compile = true``: what they change and what not.

bf16 changes the forward's numerics but never the stored dtypes (weights, gradients
and optimizer state stay fp32), and a trained model's bf16 loss is its fp32 loss to
bf16's precision; compiling changes neither numerics nor parameter names, so
checkpoints and weight hashes are those of the eager model. Tests with inductor
compile C++ kernels (a minute or more on a cold cache with 2 cores) and are marked
slow; the fast ones trace through dynamo and AOT autograd with the ``aot_eager``
backend (no C++ build), or run the captured graph as is where only the wiring counts.
That bf16 and compiled models still read only their context is
tests/model/test_causality.py.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.backends.registry import lookup_backend

from ledgerlm.config import EvalConfig, ModelConfig, TrainConfig, load_recipe
from ledgerlm.lab.run import run_recipe
from ledgerlm.model import gpt
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.evaluate import EvalCallback, evaluate, weights_digest
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.parallelize import pad_rows
from ledgerlm.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"
MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=4)
VOCAB = 50
ROWS, SEQ = 4, 16


def _rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = [(rng.integers(3, VOCAB, size=rng.integers(2, 30)), 0) for _ in range(40 * n)]
    rows = list(pack_documents(docs, SEQ + 1, 1, 2, 0))
    assert len(rows) >= n
    return rows[:n]


def _trainer(steps: int = 3, callbacks=(), rows=_rows, **train) -> Trainer:
    torch.manual_seed(0)
    model = GPT(MODEL, VOCAB)
    cfg = TrainConfig(max_steps=steps, micro_batch_rows=ROWS, warmup_steps=0, **train)
    data = iter(batches(rows(ROWS * steps), ROWS))
    return Trainer(model, build_optimizer(model, cfg), cfg, data, "isolated", callbacks)


class GraphSpy:
    """Stands in for ``torch.compile``: records its arguments and counts the graphs
    dynamo captures, then hands each to a cheap backend: ``eager`` runs the graph as is
    (the wiring only), ``aot_eager`` traces it with AOT autograd into a forward and a
    backward graph, inductor's pipeline without its C++ build."""

    def __init__(self, backend: str) -> None:
        self.kwargs: list[dict] = []
        self.graphs = 0
        self._compile = torch.compile
        self._backend = lookup_backend(backend)

    def _counting(self, gm, example_inputs):
        self.graphs += 1
        return self._backend(gm, example_inputs)

    def __call__(self, fn, **kwargs):
        # one backend for every call, as torch.compile's default is: compiled code is
        # shared only between calls with the same backend (the blocks share one graph)
        self.kwargs.append(kwargs)
        return self._compile(fn, **{**kwargs, "backend": self._counting})


def _spy(monkeypatch, backend: str):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the counts of earlier tests
    spy = GraphSpy(backend)
    monkeypatch.setattr(torch, "compile", spy)
    yield spy
    torch._dynamo.reset()


@pytest.fixture
def graph_spy(monkeypatch):
    yield from _spy(monkeypatch, "eager")


@pytest.fixture
def aot_spy(monkeypatch):
    yield from _spy(monkeypatch, "aot_eager")


# ----------------------------------------------------------------------------- bf16


def _progressions(n: int, seed: int = 0):
    """Rows of documents that count in steps of 1 to 3 (mod the vocabulary): learnable
    from the context, so a trained model is far from uniform and reads its past."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(40 * n):
        start, stride, length = rng.integers(0, VOCAB - 3), rng.integers(1, 4), rng.integers(4, 30)
        docs.append((3 + (start + stride * np.arange(length)) % (VOCAB - 3), 0))
    return list(pack_documents(docs, SEQ + 1, 1, 2, 0))[:n]


def _bf16_trained() -> Trainer:
    """20 bf16 updates on progressions (lr 2e-2): the validation loss falls from ln V
    = 3.9 to about 2.5."""
    trainer = _trainer(steps=20, rows=_progressions, precision="bf16", lr=2e-2)
    trainer.fit()
    assert [r.step for r in trainer.state.history] == list(range(1, 21))
    return trainer


# bf16 keeps 8 significant bits: it holds a number to a relative 2**-8 (its unit
# roundoff). The loss is a mean over tokens of ln sum(exp z) - z_target, with logits z
# a few bf16 roundings deep; those errors fall either way, so over the ~250 validation
# targets their mean lands well inside one rounding of the loss itself (measured: about
# 2e-4 relative). The bf16 loss must equal the fp32 one to bf16's own precision.
BF16_REL = 2**-8


def _fp32_and_bf16_losses(trainer: Trainer) -> tuple[float, float]:
    val = list(batches(_progressions(16, seed=1), ROWS))
    fp32 = evaluate(trainer.model, val, "isolated", ["d"])["loss"]
    with trainer.autocast():
        bf16 = evaluate(trainer.model, val, "isolated", ["d"])["loss"]
    return fp32, bf16


def test_bf16_loss_of_a_trained_model_is_its_fp32_loss_to_bf16_precision():
    fp32, bf16 = _fp32_and_bf16_losses(_bf16_trained())
    assert fp32 < 0.7 * np.log(VOCAB)  # trained: far from uniform, it reads its context
    assert bf16 != fp32  # the forward really ran in bf16
    assert bf16 == pytest.approx(fp32, rel=BF16_REL)


def test_the_bf16_comparison_fails_for_a_model_that_reads_the_future_under_autocast(
    monkeypatch,
):
    """Trained with an attention that drops its mask under autocast, a model learns to
    read the next token; in fp32 it cannot: the losses are 3% apart (8 allowances)."""
    real = gpt.attend

    def leaky(q, k, v, attn):
        if torch.is_autocast_enabled(q.device.type):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return real(q, k, v, attn)

    monkeypatch.setattr(gpt, "attend", leaky)
    fp32, bf16 = _fp32_and_bf16_losses(_bf16_trained())
    assert bf16 != pytest.approx(fp32, rel=BF16_REL)
    assert bf16 < (1 - 4 * BF16_REL) * fp32  # no near miss: it reads the answer


def test_bf16_training_keeps_weights_gradients_and_optimizer_state_fp32():
    trainer = _trainer(steps=4, precision="bf16", grad_clip=0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.fit()
    assert [r.step for r in trainer.state.history] == [1, 2, 3, 4]
    assert all(np.isfinite(r.loss) and not r.skipped for r in trainer.state.history)
    for name, p in trainer.model.named_parameters():
        assert p.dtype == torch.float32, name
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        assert not torch.equal(p, before[name]), name  # every parameter was trained
    for state in trainer.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32


class _Autocast:
    def __init__(self) -> None:
        self.seen: list[tuple[bool, torch.dtype]] = []

    def _record(self, trainer) -> None:
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    on_train_start = on_step_end = on_train_end = _record


@pytest.mark.parametrize(("precision", "enabled"), [("fp32", False), ("bf16", True)])
def test_callbacks_and_evaluation_run_under_the_training_precision(precision, enabled):
    val = list(batches(_rows(6, seed=1), ROWS))  # a smaller last batch, as in a real run
    spy = _Autocast()
    evaluator = EvalCallback(val, EvalConfig(every_steps=1, target_loss=0.1), "isolated", ["d"])
    trainer = _trainer(steps=2, callbacks=[spy, evaluator], precision=precision)
    trainer.fit()
    assert {s[0] for s in spy.seen} == {enabled}
    if enabled:
        assert {s[1] for s in spy.seen} == {torch.bfloat16}
    with trainer.autocast():
        expected = evaluate(trainer.model, val, "isolated", ["d"])
    assert evaluator.history[-1]["metrics"] == expected
    if enabled:  # and bf16 evaluation is not fp32 evaluation
        assert expected["loss"] != evaluate(trainer.model, val, "isolated", ["d"])["loss"]


# ----------------------------------------------------------------------------- compile


def _compiled_evaluations(val) -> tuple[Trainer, EvalCallback]:
    evaluator = EvalCallback(val, EvalConfig(every_steps=1, target_loss=0.1), "isolated", ["d"])
    return _trainer(compile=True, callbacks=[evaluator]), evaluator


def test_compile_option_is_wired_in_place_and_keeps_names_and_numbers(aot_spy):
    """Compiled with AOT autograd's forward and backward graphs: the losses, gradients
    and weights of eager training, bitwise. ``aot_eager`` runs the aten ops eager runs,
    on the same shapes in the same order (no decomposition, no fusion), and its
    backward graph is autograd's own derivative formulas; any difference is a compiled
    model that computes something else. (Inductor reorders sums: the slow test below.)
    """
    eager = _trainer()
    # the validation set as the lab gives it to a compiled run: the last batch padded
    val = pad_rows(list(batches(_rows(6, seed=1), ROWS)), ROWS)
    compiled, evaluator = _compiled_evaluations(val)
    # each block in place, whole-graph (a graph break would raise), static shapes
    assert aot_spy.kwargs == [{"dynamic": False, "fullgraph": True}] * MODEL.n_layers
    assert compiled.model.state_dict().keys() == eager.model.state_dict().keys()
    assert isinstance(compiled.model, GPT)

    compiled.fit()
    assert len(evaluator.history) == 3
    # one graph for every block's training forward, one for evaluation; the padded last
    # batch and the later evaluations compile nothing more
    assert aot_spy.graphs == 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    eager.fit()
    for a, b in zip(compiled.state.history, eager.state.history, strict=True):
        assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm)
    for (name, a), b in zip(
        compiled.model.named_parameters(), eager.model.parameters(), strict=True
    ):
        assert torch.equal(a.grad, b.grad), name  # the last step's gradients
    assert evaluator.history[-1]["snapshot"] == weights_digest(eager.model)


def test_a_smaller_last_validation_batch_is_a_recompile_the_count_sees(graph_spy):
    """Unpadded, the last batch (2 rows of 4) is one more graph: what the count above
    rules out."""
    val = list(batches(_rows(6, seed=1), ROWS))
    assert val[-1].input_ids.shape[0] < ROWS
    compiled, _ = _compiled_evaluations(val)
    compiled.fit()
    assert graph_spy.graphs == 3


@pytest.mark.slow
def test_inductor_training_matches_eager():
    """fp32 inductor kernels reorder sums, nothing else: same losses to 1e-4."""
    torch._dynamo.reset()
    eager = _trainer(steps=4)
    compiled = _trainer(steps=4, compile=True)
    eager.fit()
    compiled.fit()
    for a, b in zip(compiled.state.history, eager.state.history, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-4)
    assert compiled.model.state_dict().keys() == eager.model.state_dict().keys()
    for (name, a), b in zip(
        compiled.model.state_dict().items(), eager.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3, msg=name)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- end to end


def _run_tiny(workspace: Path) -> dict:
    recipe = load_recipe(
        TINY,
        [
            "train.compile=true",
            'train.precision="bf16"',
            "train.max_steps=20",
            "eval.every_steps=10",
            "eval.target_loss=0.5",
            "data.test_fraction=0.1",  # scored once at the end, through the graph too
        ],
    )
    result = run_recipe(recipe, Workspace(workspace))
    summary = result.summary
    assert summary["run"]["status"] == "not reached"
    assert summary["counters"]["optimizer_updates"] == 20
    assert [e["step"] for e in summary["evaluations"]] == [10, 20]
    assert "test_evaluation" in [e["kind"] for e in summary["events"]]
    weights = load_file(
        str(workspace / "runs" / result.run_id / "checkpoint" / "model.safetensors")
    )
    assert "embed.weight" in weights
    assert not [k for k in weights if "_orig_mod" in k]
    return summary


def test_tiny_run_with_compile_and_bf16_completes(tmp_path, graph_spy):
    _run_tiny(tmp_path)
    assert graph_spy.kwargs == [{"dynamic": False, "fullgraph": True}] * 2  # tiny's blocks
    assert graph_spy.graphs == 2  # training and evaluation both went through the graph


@pytest.mark.slow
def test_tiny_run_with_inductor_and_bf16_completes(tmp_path):
    torch._dynamo.reset()
    _run_tiny(tmp_path)
    torch._dynamo.reset()
