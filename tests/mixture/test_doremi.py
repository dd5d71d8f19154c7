"""DoReMi's update (exponentiated gradient on excess loss, smoothed to uniform) and the
sampler's online reweighting, which a resume continues bitwise."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fake_store import FakeTokenStore
from ledgerlm.config import PackConfig
from ledgerlm.mixture.doremi import ETA, SMOOTHING, doremi_update, excess_loss
from ledgerlm.mixture.schedule import Segment
from ledgerlm.tokens.loader import train_batches


def test_the_update_by_hand():
    alpha = np.array([0.5, 0.3, 0.2])
    excess = excess_loss([3.0, 2.0, 2.5], [2.5, 2.2, 2.5])
    assert excess.tolist() == [0.5, 0.0, 0.0]  # a domain ahead of the reference adds nothing
    raised = alpha * np.exp(ETA * excess)
    expected = (1 - SMOOTHING) * raised / raised.sum() + SMOOTHING / 3
    assert np.allclose(doremi_update(alpha, excess), expected, rtol=0, atol=1e-15)
    assert ETA == 1.0 and SMOOTHING == 1e-3  # the paper's values


@given(
    alpha=st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=8),
    excess=st.lists(st.floats(0.0, 1e4), min_size=8, max_size=8),
)
def test_updated_weights_are_a_smoothed_mixture(alpha, excess):
    a = np.array(alpha) / sum(alpha)
    new = doremi_update(a, np.array(excess[: len(a)]))
    assert abs(new.sum() - 1) < 1e-12
    assert np.all(new >= SMOOTHING / len(a) - 1e-15)  # never below the smoothing floor
    # before smoothing, the domain with the largest excess gains the most weight
    e = np.array(excess[: len(a)])
    raised = doremi_update(a, e, smoothing=0.0)
    i = int(np.argmax(e))
    assert raised[i] / a[i] >= np.max(raised / a) * (1 - 1e-9)


def test_no_excess_leaves_the_weights_almost_unchanged():
    alpha = np.array([0.7, 0.2, 0.1])
    assert np.allclose(doremi_update(alpha, np.zeros(3)), 0.999 * alpha + 0.001 / 3)


def _store() -> FakeTokenStore:
    rng = np.random.default_rng(0)
    domains = np.arange(24) % 3
    docs = [rng.integers(3, 90, size=rng.integers(2, 30)) for _ in domains]
    return FakeTokenStore(docs, domains, ["a", "b", "c"])


def test_a_reweighted_stream_follows_the_new_weights_and_resumes_bitwise():
    store, pack = _store(), PackConfig(seq_len=15)
    uniform = [Segment(None, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})]
    stream = train_batches(store, pack, 4, seed=1, mixture=uniform)
    for _ in range(5):
        next(stream)
    before = list(stream.consumed)
    stream.reweight([0.0, 0.0, 1.0])
    for _ in range(3):
        next(stream)
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["mix"]["override"] == [0.0, 0.0, 1.0]
    resumed = train_batches(store, pack, 4, seed=1, cursor=state, mixture=uniform)
    for _ in range(10):
        a, b = next(stream), next(resumed)
        assert all(np.array_equal(x, y) for x, y in zip(a.input_ids, b.input_ids, strict=True))
    gained = np.array(stream.consumed) - np.array(before + [0] * (3 - len(before)))
    # after the document in progress, only c: a and b gain at most one document each
    assert gained[2] > 0.8 * gained.sum()
    with pytest.raises(ValueError, match="3 weights"):
        stream.reweight([1.0, 0.0])
