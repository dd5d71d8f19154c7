"""The step loop reads nothing back from the device on an update that neither logs nor
evaluates: the loss and grad norm of update t are copied to a host buffer and read by
update t + 1 (after its forward and backward are queued) or by a ledger flush.

On CPU nothing is asynchronous, so the test counts the calls that would wait for a GPU
(``Tensor.item``, ``float``, ``int``, ``bool``, ``tolist`` of a tensor) made while
``fit`` runs, update by update: zero between two ledger flushes."""

import math
from collections import Counter

import numpy as np
import pytest
import torch

import ledgerlm.train.loop as loop
from finite import Poison
from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.lab.recorder import LedgerRecorder
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer

READS = ("item", "__float__", "__int__", "__bool__", "tolist")
EVERY = 3  # the ledger's flush_every: the logging updates
STEPS = 7


def _data():
    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, 40, size=rng.integers(4, 30)), i % 3) for i in range(400)]
    return list(batches(pack_documents(docs, 17, 1, 2, 0), 4))


def _trainer(recorder=None, callbacks=()) -> Trainer:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    cfg = TrainConfig(max_steps=STEPS, micro_batch_rows=4, grad_accum=2, spike_warmup=2)
    optimizer = build_optimizer(model, cfg)
    return Trainer(model, optimizer, cfg, iter(_data()), "isolated", callbacks, recorder)


class _Reads:
    """Counts the patched reads; ``per_update`` the ones made since the last update ended
    (that update's own work, and its recorder's flush if it made one)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.per_update: list[Counter[str]] = []
        self.unread: list[bool] = []

    def on_train_start(self, trainer) -> None:
        self.count.clear()

    def on_step_end(self, trainer) -> None:
        self.per_update.append(self.count.copy())
        self.count.clear()
        self.unread.append(trainer.unread is trainer.state.history[-1])

    def on_train_end(self, trainer) -> None:
        pass


def _patch_reads(monkeypatch, reads: _Reads) -> None:
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            reads.count[_name] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)


def _run(tmp_path, monkeypatch, reads: _Reads):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run_id = ledger.create_run("t", {}, target_metric="loss", target_value=1.0, eval_every=1)
    recorder = LedgerRecorder(ledger, run_id, flush_every=EVERY, flush_seconds=math.inf)
    trainer = _trainer(recorder, [reads])
    recorder.start("train", 0)  # the phase is open before fit: no first-update beat
    _patch_reads(monkeypatch, reads)
    trainer.fit()
    monkeypatch.undo()
    rows = ledger.steps(run_id)
    ledger.close()
    return trainer, rows


def test_no_update_reads_the_device_and_the_ledger_gets_every_loss(tmp_path, monkeypatch):
    reads = _Reads()
    trainer, rows = _run(tmp_path, monkeypatch, reads)
    assert len(reads.per_update) == STEPS
    assert all(not c for c in reads.per_update), reads.per_update
    # between flushes the update's values are still unread when it ends (the phase's
    # first update beats it, then every EVERY rows: 1, 4, 7)
    flushes = list(range(1, STEPS + 1, EVERY))
    assert reads.unread == [t not in flushes for t in range(1, STEPS + 1)]
    # and every row holds the loss a caller reading at once (train_step) gets
    reference = _trainer()
    expected = [(reference.train_step(), reference.state.grad_norm) for _ in range(STEPS)]
    assert [(r["loss"], r["grad_norm"]) for r in rows] == expected
    assert [(h.loss, h.grad_norm) for h in trainer.state.history] == expected
    assert trainer.state.loss == expected[-1][0]


def test_a_float_of_the_loss_on_every_update_is_caught(tmp_path, monkeypatch):
    """The break: the step loop reads its numerator back as it used to."""
    real = loop.Trainer.settle

    def settle_and_read(self):
        real(self)
        float(torch.zeros(()))  # what float(total) did on every update

    monkeypatch.setattr(loop.Trainer, "settle", settle_and_read)
    reads = _Reads()
    _run(tmp_path, monkeypatch, reads)
    assert sum(c["__float__"] for c in reads.per_update) >= STEPS - 1


@pytest.mark.parametrize("policy", ["nonfinite", "on_spike"])
def test_a_skip_policy_reads_each_update_before_its_step(policy):
    trainer = _trainer()
    trainer.cfg = trainer.cfg.model_copy(
        update={"nonfinite": "skip"} if policy == "nonfinite" else {"on_spike": "skip"}
    )
    assert trainer.reads_at_once
    trainer.fit()
    assert trainer.unread is None and trainer.state.step == STEPS


def test_a_non_finite_update_read_late_stops_at_the_next_update(tmp_path):
    """Under nonfinite = "stop" update 3 is applied and read by update 4, after update 4's
    forwards: the run stops with step 3's event, its state at step 2 and no row for 3."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run_id = ledger.create_run("t", {}, target_metric="loss", target_value=1.0, eval_every=1)
    recorder = LedgerRecorder(ledger, run_id, flush_every=EVERY, flush_seconds=math.inf)
    trainer = _trainer(recorder)
    poison = Poison(at=5)  # update 3's first micro-batch (grad_accum = 2)
    trainer.model.register_forward_hook(poison)
    with pytest.raises(loop.NonFiniteLossError, match="step 3"):
        trainer.fit()
    assert poison.calls == 8  # update 4's two forwards ran before the read
    s = trainer.state
    assert s.step == 2 and [r.step for r in s.history] == [1, 2]
    assert s.tokens == sum(r.tokens for r in s.history) and math.isfinite(s.loss)
    assert [e["step"] for e in trainer.events] == [3] and trainer.events[0]["loss"] == "nan"
    recorder.flush()  # as the lab does when a run fails
    assert [r["step"] for r in ledger.steps(run_id)] == [1, 2]
    ledger.close()
