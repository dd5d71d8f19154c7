"""Requirement L6: a loss spike is logged against its step and the data that produced it, and
under ``on_spike = "skip"`` its update is dropped as a non-finite one is."""

import json
import statistics
from pathlib import Path

import pyarrow.compute as pc
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fake_store import two_domain_store
from kill_at import KillAt, Killed
from ledgerlm.config import ModelConfig, PackConfig, TrainConfig, load_recipe
from ledgerlm.lab.run import run_recipe
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.progress import NullProgress
from ledgerlm.tokens.loader import epoch_order, train_batches
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.train.checkpointing import CheckpointCallback, load_training
from ledgerlm.train.distributed import RankShard, World
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.record import Recorder
from ledgerlm.train.spikes import SpikeDetector
from ledgerlm.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.toml"

# -- the detector ---------------------------------------------------------------------

losses = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(
    st.lists(losses, min_size=1, max_size=300),
    st.floats(min_value=1.01, max_value=10),
    st.integers(0, 20),
    st.integers(1, 50),
)
def test_a_non_increasing_sequence_is_never_a_spike(values, factor, warmup, window):
    detector = SpikeDetector(factor, warmup, window)
    for loss in sorted(values, reverse=True):
        assert detector.observe(loss) is None
    constant = SpikeDetector(factor, warmup, window)
    assert all(constant.observe(values[0]) is None for _ in range(len(values)))


@given(
    st.lists(st.floats(min_value=0.01, max_value=1e3), min_size=1, max_size=200),
    st.floats(min_value=1.01, max_value=10),
    st.integers(1, 50),
    st.floats(min_value=1e-6, max_value=1e3),
)
def test_a_loss_above_factor_times_the_running_median_is_a_spike(values, factor, window, above):
    detector = SpikeDetector(factor, warmup=len(values), window=window)
    for loss in values:
        assert detector.observe(loss) is None
    median = statistics.median(values[-window:])
    assert detector.median == median
    spike = factor * median * (1 + above)
    assert detector.observe(spike) == median
    assert detector.observe(detector.median * factor) is None  # at the factor: not above


@given(st.lists(st.floats(min_value=0.01, max_value=1e3), min_size=2, max_size=120))
def test_nothing_is_a_spike_before_the_warmup(values):
    detector = SpikeDetector(3.0, warmup=len(values) + 1, window=10)
    assert all(detector.observe(v) is None for v in values)
    assert detector.observe(1e9) is None  # the warmup-th loss: still not looked at
    assert detector.observe(1e12) is not None
    assert SpikeDetector(0, 0).observe(1.0) is None  # a factor of 0 is off


@given(st.lists(st.floats(min_value=0.01, max_value=1e3), min_size=1, max_size=300))
def test_a_restored_detector_decides_as_the_uninterrupted_one(values):
    cut = len(values) // 2
    args = (1.5, 6, 3)  # a warmup longer than the window: the count is state too
    whole, first = SpikeDetector(*args), SpikeDetector(*args)
    for v in values[:cut]:
        whole.observe(v)
        first.observe(v)
    second = SpikeDetector(*args)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [whole.observe(v) for v in values[cut:]] == [second.observe(v) for v in values[cut:]]


def test_spike_factor_must_be_above_one_or_off():
    with pytest.raises(ValueError, match="factor above 1"):
        TrainConfig(spike_factor=1.0)
    assert TrainConfig(spike_factor=0).spike_factor == 0
    cfg = TrainConfig()
    assert (cfg.spike_factor, cfg.spike_warmup, cfg.on_spike) == (3.0, 50, "record")


# -- the trainer on a real stream -------------------------------------------------------


class _LrJump:
    """After update ``at``, the learning rate ``by`` times larger: the next update wrecks
    the weights, so the loss of the one after it spikes."""

    def __init__(self, at: int, by: float) -> None:
        self.at, self.by = at, by

    def on_train_start(self, trainer) -> None:
        pass

    def on_step_end(self, trainer) -> None:
        if trainer.state.step == self.at:
            for group in trainer.optimizer.param_groups:
                group["base_lr"] *= self.by

    def on_train_end(self, trainer) -> None:
        pass


class _Notes(Recorder):
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.events: list[tuple[str, dict, int | None]] = []

    def event(self, kind, message, step=None) -> None:
        self.events.append((kind, json.loads(message), step))

    def note(self, line: str) -> None:
        self.lines.append(line)


def _cfg(**train) -> TrainConfig:
    base = dict(max_steps=18, micro_batch_rows=4, warmup_steps=0, lr=1e-2, spike_warmup=8)
    return TrainConfig(schedule="constant", **{**base, **train})


def _stream(cfg: TrainConfig, cursor=None):
    return train_batches(
        two_domain_store(), PackConfig(seq_len=16), cfg.micro_batch_rows, 0, cursor
    )


def _trainer(cfg: TrainConfig, *callbacks, recorder=None) -> Trainer:
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 60)
    optimizer = build_optimizer(model, cfg)
    return Trainer(model, optimizer, cfg, _stream(cfg), "isolated", list(callbacks), recorder)


def _documents_of_update(step: int, cfg: TrainConfig) -> list[int]:
    """The train documents whose tokens the ``step``-th batch of the stream holds, from
    the stream's definition: epochs of seeded orders cut into rows of 17 tokens."""
    docs = two_domain_store().docs
    need = 17 * cfg.micro_batch_rows * cfg.grad_accum
    start, end = (step - 1) * need, step * need
    out, at, epoch = [], 0, 0
    while at < end:
        for i in epoch_order(docs["weight"], 0, epoch):
            packed = int(docs["length"][i]) + 2
            if at < end and at + packed > start:
                out.append(int(i))
            at += packed
        epoch += 1
    return list(dict.fromkeys(out))


def test_a_spike_is_an_event_with_its_step_median_and_documents_and_a_warning():
    notes = _Notes()
    trainer = _trainer(_cfg(), _LrJump(10, 300), recorder=notes)
    trainer.fit()
    history = trainer.state.history
    assert all(not r.skipped for r in history)  # recorded, applied
    spikes = [(k, e) for k, e, _ in notes.events if k == "loss_spike"]
    first = spikes[0][1]
    assert first["step"] == 12  # the update after the one made at 300 x the learning rate
    assert [e for _, e in spikes] == trainer.events
    assert [step for *_, step in notes.events] == [e["step"] for e in trainer.events]
    previous = [r.loss for r in history[: first["step"] - 1]]
    assert first["median"] == statistics.median(previous)
    assert first["loss"] == history[first["step"] - 1].loss > 3 * first["median"]
    assert (first["factor"], first["window"], first["policy"]) == (3.0, 11, "record")
    assert first["documents"] == _documents_of_update(12, trainer.cfg)
    names = two_domain_store().domains
    assert first["domains"] == sorted({names[i % 2] for i in first["documents"]})
    assert len(notes.lines) == len(spikes)
    assert notes.lines[0].startswith("warning: loss spike at step 12: loss ")
    assert "the update is applied" in notes.lines[0]


def test_skip_drops_the_spiking_update_and_counts_it():
    trainer = _trainer(_cfg(on_spike="skip", max_steps=11), _LrJump(10, 300))
    trainer.fit()  # the jump after update 10 is in update 11
    before = [p.detach().clone() for p in trainer.model.parameters()]
    adam = {id(p): float(s["step"]) for p, s in trainer.optimizer.state.items()}
    tokens = trainer.state.tokens
    trainer.train_step()  # update 12: the spike
    s = trainer.state
    assert s.step == 11 and s.skipped_steps == 1 and s.history[-1].skipped
    assert trainer.events[0]["step"] == 12 and trainer.events[0]["policy"] == "skip"
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert {id(p): float(st["step"]) for p, st in trainer.optimizer.state.items()} == adam
    assert all(p.grad is None for p in trainer.model.parameters())
    assert s.tokens > tokens  # its data was consumed
    trainer.cfg = trainer.cfg.model_copy(update={"max_steps": 18})
    state = trainer.fit()
    skipped = [r for r in state.history if r.skipped]
    assert state.skipped_steps == len(skipped) == len(trainer.events)
    assert state.counters()["skipped_updates"] == len(skipped)
    assert state.step == 18


def test_under_accumulation_the_update_and_all_its_documents_are_judged():
    """Two micro-batches of 2 rows make the update one batch of 4 rows makes: the same
    spikes, each naming the documents of both micro-batches."""
    one = _trainer(_cfg(), _LrJump(10, 300))
    one.fit()
    two = _trainer(_cfg(micro_batch_rows=2, grad_accum=2), _LrJump(10, 300))
    two.fit()
    assert len(one.events) == len(two.events) > 1
    for a, b in zip(one.events, two.events, strict=True):
        assert a["step"] == b["step"] and a["documents"] == b["documents"]
    # Not bitwise: the model is fp32 and one batch of 4 rows sums in another order than
    # two micro-batches of 2, a rounding that grows over the updates before (later
    # events differ more).
    first, again = one.events[0], two.events[0]
    assert first["loss"] == pytest.approx(again["loss"], rel=1e-4)
    assert first["median"] == pytest.approx(again["median"], rel=1e-5)


def test_every_rank_names_the_documents_of_every_rank_share():
    """Each rank walks the global stream and keeps every other micro-batch: the documents
    it reports for a step are those of both ranks' micro-batches."""
    cfg = _cfg()
    whole, placed = _stream(cfg), []
    for _ in range(2):
        next(whole)
        placed += whole.last_documents
    both = _documents_of_update(1, _cfg(grad_accum=2))  # the first two micro-batches
    assert whole.describe_documents(placed)["documents"] == both
    for rank in (0, 1):
        shard = RankShard(_stream(cfg), World(rank=rank, size=2))
        next(shard)
        assert shard.last_documents == placed
        described = shard.describe_documents(shard.last_documents)
        assert described["documents"] == both and len(both) > 2


def test_a_resumed_run_records_the_spikes_of_the_uninterrupted_one(tmp_path):
    """Checkpoint at update 10, killed at 12; the jump comes at 11, after the checkpoint,
    so the resumed run's spikes are judged against the window it restored."""
    cfg = _cfg(max_steps=20, checkpoint_every=5)
    reference = _trainer(cfg, _LrJump(11, 300))
    reference.fit()
    assert reference.events and reference.events[0]["step"] == 13

    ck = tmp_path / "ck"
    with pytest.raises(Killed):
        _trainer(cfg, CheckpointCallback(ck, 5), _LrJump(11, 300), KillAt(12)).fit()
    fresh = _trainer(cfg)
    state = load_training(ck, fresh.model, fresh.optimizer)
    assert state["step"] == 10
    resumed = Trainer(
        fresh.model,
        fresh.optimizer,
        cfg,
        _stream(cfg, state["data"]),
        "isolated",
        [_LrJump(11, 300)],
    )
    resumed.load_state_dict(state["trainer"])
    resumed.fit()
    assert resumed.events == reference.events


# -- a real run of the tiny recipe ------------------------------------------------------


class _Lines(NullProgress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)


def test_a_tiny_run_logs_a_spike_against_its_step_and_documents(tmp_path):
    overrides = ["train.max_steps=26", "train.spike_warmup=10", "eval.every_steps=100"]
    recipe = load_recipe(TINY, [*overrides, "train.threads=1"])
    progress = _Lines()
    result = run_recipe(recipe, Workspace(tmp_path), progress, callbacks=[_LrJump(20, 3000)])
    with Ledger(tmp_path / "ledger.db") as ledger:
        steps = ledger.steps(result.run_id)
    events = [e for e in result.summary["events"] if e["kind"] == "loss_spike"]
    losses = [r["loss"] for r in steps]
    # every update whose loss is above 3 x the median of the ones before it, past the
    # first 10, and no other
    expected = [
        i + 1
        for i in range(10, len(losses))
        if losses[i] > 3 * statistics.median(losses[max(0, i - 100) : i])
    ]
    assert [e["step"] for e in events] == expected and expected[0] == 22
    spike = json.loads(events[0]["message"])
    # the event's loss is the update's, the median one of the 21 before it: the same
    # floats as the ledger's rows (JSON and SQLite keep a float64 exactly)
    assert spike["step"] == 22 and spike["loss"] == losses[21]
    assert spike["median"] == statistics.median(losses[:21])
    assert spike["loss"] > spike["factor"] * spike["median"] and spike["factor"] == 3.0

    # the documents of update 22's batch: where its tokens fall in the seeded epochs
    store = TokenStore(result.tokens.path)
    docs = store.split_docs("train")
    need = (recipe.pack.seq_len + 1) * recipe.train.micro_batch_rows
    start, end = 21 * need, 22 * need
    at, placed = 0, []
    for i in epoch_order(docs["weight"], recipe.train.seed, 0):
        packed = int(docs["length"][i]) + 2
        if at < end and at + packed > start:
            placed.append(int(i))
        at += packed
    assert at >= end  # the tiny recipe's first epoch is longer than 22 updates
    train = store.index.filter(pc.equal(store.index.column("split"), "train"))
    assert spike["documents"] == [train.column("doc_id")[i].as_py() for i in placed]
    assert spike["domains"] == sorted({train.column("domain")[i].as_py() for i in placed})
    assert len(progress.lines) == len(events)
    assert progress.lines[0].startswith("warning: loss spike at step 22")
