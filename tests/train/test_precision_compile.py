"""``train.precision = "bf16"`` and ``train.compile = true``: what they change and what not.

bf16 changes the forward's numerics but never the stored dtypes (weights, gradients
and optimizer state stay fp32); compiling changes neither numerics (beyond
rounding) nor parameter names, so checkpoints and weight hashes are those of the
eager model. Tests with inductor compile C++ kernels (a minute or more on a cold
cache with 2 cores) and are marked slow; the fast ones trace through dynamo with a
backend that runs the captured graph as is, which proves the wiring.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ledgerlm.config import EvalConfig, ModelConfig, TrainConfig, load_recipe
from ledgerlm.lab.run import run_recipe
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.evaluate import EvalCallback, evaluate, weights_digest
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
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


def _trainer(steps: int = 3, callbacks=(), **train) -> Trainer:
    torch.manual_seed(0)
    model = GPT(MODEL, VOCAB)
    cfg = TrainConfig(max_steps=steps, micro_batch_rows=ROWS, warmup_steps=0, **train)
    data = iter(batches(_rows(ROWS * steps), ROWS))
    return Trainer(model, build_optimizer(model, cfg), cfg, data, "isolated", callbacks)


class GraphSpy:
    """Stands in for ``torch.compile``: records its arguments and the graphs dynamo
    captures, then runs each graph as is (no inductor, so no C++ build)."""

    def __init__(self) -> None:
        self.kwargs: list[dict] = []
        self.graphs = 0
        self._compile = torch.compile

    def __call__(self, fn, **kwargs):
        self.kwargs.append(kwargs)

        def backend(gm, example_inputs):
            self.graphs += 1
            return gm.forward

        return self._compile(fn, **{**kwargs, "backend": backend})


@pytest.fixture
def graph_spy(monkeypatch):
    torch._dynamo.reset()
    spy = GraphSpy()
    monkeypatch.setattr(torch, "compile", spy)
    yield spy
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- bf16


def test_bf16_first_step_loss_is_close_to_fp32():
    fp32 = _trainer(steps=1).train_step()
    bf16 = _trainer(steps=1, precision="bf16").train_step()
    assert bf16 != fp32  # the forward really ran in bf16
    assert bf16 == pytest.approx(fp32, abs=0.05)


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


def test_compile_option_is_wired_in_place_and_keeps_names(graph_spy):
    eager = _trainer()
    val = list(batches(_rows(6, seed=1), ROWS))
    evaluator = EvalCallback(val, EvalConfig(every_steps=1, target_loss=0.1), "isolated", ["d"])
    compiled = _trainer(compile=True, callbacks=[evaluator])
    assert graph_spy.kwargs == [{"dynamic": False}]
    assert compiled.model.state_dict().keys() == eager.model.state_dict().keys()
    assert isinstance(compiled.model, GPT)

    compiled.fit()
    # train forward, eval forward, and the smaller last validation batch; no more
    assert graph_spy.graphs == 3
    eager.fit()
    for a, b in zip(compiled.state.history, eager.state.history, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert evaluator.history[-1]["snapshot"] == weights_digest(eager.model)


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
        ],
    )
    result = run_recipe(recipe, Workspace(workspace))
    summary = result.summary
    assert summary["run"]["status"] == "not reached"
    assert summary["counters"]["optimizer_updates"] == 20
    assert [e["step"] for e in summary["evaluations"]] == [10, 20]
    weights = load_file(
        str(workspace / "runs" / result.run_id / "checkpoint" / "model.safetensors")
    )
    assert "embed.weight" in weights
    assert not [k for k in weights if "_orig_mod" in k]
    return summary


def test_tiny_run_with_compile_and_bf16_completes(tmp_path, graph_spy):
    _run_tiny(tmp_path)
    assert graph_spy.kwargs == [{"dynamic": False}]
    assert graph_spy.graphs >= 2  # training and evaluation both went through the graph


@pytest.mark.slow
def test_tiny_run_with_inductor_and_bf16_completes(tmp_path):
    torch._dynamo.reset()
    _run_tiny(tmp_path)
    torch._dynamo.reset()
