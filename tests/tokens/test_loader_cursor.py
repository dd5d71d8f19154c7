"""A training stream restarted from its cursor yields exactly the batches that the
uninterrupted stream would have yielded next, at a cost that does not grow with steps."""

import json
from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_store import FakeTokenStore
from ledgerlm.config import PackConfig
from ledgerlm.tokens.loader import Cursor, TrainStream, epoch_order, train_batches
from ledgerlm.tokens.packing import Batch, batches, pack_documents

BOS, EOS, PAD = 1, 2, 0


def _stream(docs, weights, seed, row_len, batch_rows, cursor=None, fetched=None):
    def fetch(i):
        if fetched is not None:
            fetched.append(i)
        return np.asarray(docs[i], dtype=np.int64), i % 3

    return TrainStream(
        fetch,
        lambda epoch: epoch_order(weights, seed, epoch),
        row_len,
        batch_rows,
        BOS,
        EOS,
        cursor=cursor,
    )


def _assert_same(a: Batch, b: Batch) -> None:
    for f in fields(Batch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and torch.equal(x, y), f.name


documents = st.lists(st.lists(st.integers(3, 60), max_size=30), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(
    docs=documents,
    weight_seed=st.integers(0, 2**16),
    row_len=st.integers(2, 40),
    batch_rows=st.integers(1, 4),
    total=st.integers(1, 30),
    data=st.data(),
)
def test_resuming_from_any_cursor_continues_the_stream_exactly(
    docs, weight_seed, row_len, batch_rows, total, data
):
    weights = np.random.default_rng(weight_seed).integers(1, 3, size=len(docs)).astype(float)
    seed = weight_seed % 7
    stream = _stream(docs, weights, seed, row_len, batch_rows)
    out, cursors = [], [stream.cursor]
    for _ in range(total):
        out.append(next(stream))
        cursors.append(stream.cursor)
    cut = data.draw(st.integers(0, total - 1), label="cut")
    saved = json.loads(json.dumps(cursors[cut].to_dict()))  # as it travels in state.json
    resumed = _stream(docs, weights, seed, row_len, batch_rows, Cursor.from_dict(saved))
    for expected in out[cut:]:
        _assert_same(next(resumed), expected)
    assert resumed.cursor == cursors[-1]


@settings(max_examples=40, deadline=None)
@given(docs=documents, row_len=st.integers(2, 33), batch_rows=st.integers(1, 3))
def test_stream_equals_packing_the_epochs_documents(docs, row_len, batch_rows):
    """The stream cuts rows exactly as pack_documents + batches do (the original loader)."""
    weights = np.ones(len(docs))

    def epochs():
        for epoch in range(1000):
            for i in epoch_order(weights, 5, epoch):
                yield np.asarray(docs[i], dtype=np.int64), int(i) % 3

    reference = batches(pack_documents(epochs(), row_len, BOS, EOS, PAD), batch_rows)
    stream = _stream(docs, weights, 5, row_len, batch_rows)
    for _ in range(12):
        _assert_same(next(stream), next(reference))


def test_resume_reads_only_the_documents_it_needs():
    """No replay: resuming deep into the stream reads O(one batch) of documents."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 50, size=rng.integers(0, 40)) for _ in range(50)]
    weights = np.ones(len(docs))
    stream = _stream(docs, weights, 0, 17, 2)
    for _ in range(2000):
        next(stream)
    cursor = stream.cursor
    assert cursor.epoch > 10
    fetched: list[int] = []
    resumed = _stream(docs, weights, 0, 17, 2, cursor, fetched)
    _assert_same(next(resumed), next(stream))
    assert len(fetched) <= 2 * 17 // 2 + 2  # every document holds at least BOS + EOS


def test_bad_cursor_is_refused():
    docs, weights = [[5, 6, 7]], np.ones(1)
    with pytest.raises(ValueError, match="offset"):
        _stream(docs, weights, 0, 4, 1, Cursor(offset=5))
    with pytest.raises(ValueError, match="index"):
        _stream(docs, weights, 0, 4, 1, Cursor(index=1))


def test_train_batches_state_dict_round_trip_and_checks():
    rng = np.random.default_rng(1)
    docs = [rng.integers(3, 99, size=rng.integers(1, 30)) for _ in range(9)]
    store = FakeTokenStore(docs, np.arange(9) % 2)
    pack = PackConfig(seq_len=15)
    stream = train_batches(store, pack, 3, seed=4)
    for _ in range(7):
        next(stream)
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["seed"] == 4 and state["documents"] == 9
    resumed = train_batches(store, pack, 3, seed=4, cursor=state)
    for _ in range(5):
        _assert_same(next(resumed), next(stream))
    with pytest.raises(ValueError, match="seed"):
        train_batches(store, pack, 3, seed=5, cursor=state)
