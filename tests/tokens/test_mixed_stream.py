"""The mixture sampler: token-level shares whatever the document lengths, dedup visits
composed in, stages switching at their boundary, and a bitwise resume from any state."""

import json
from dataclasses import fields

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerlm.config import MixtureConfig, PackConfig
from ledgerlm.mixture.schedule import Segment, resolve
from ledgerlm.tokens.loader import natural_shares, train_batches, train_pools
from ledgerlm.tokens.packing import Batch

BOS, EOS, PAD = 1, 2, 0
DOMAINS = ["code", "docs", "math"]


class _Store:
    """The TokenStore members the train stream reads, for documents of given domains."""

    def __init__(self, docs, domains, weights=None):
        self.special = {"bos": BOS, "eos": EOS, "pad": PAD}
        self.domains = DOMAINS
        self.flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs])
        lengths = np.array([len(d) for d in docs])
        self.docs = {
            "shard": np.array(["train.bin"] * len(docs), dtype=object),
            "offset": np.concatenate([[0], np.cumsum(lengths)[:-1]]),
            "length": lengths,
            "domain": np.asarray(domains, dtype=np.int64),
            "weight": np.ones(len(docs)) if weights is None else np.asarray(weights, float),
        }

    def split_docs(self, split):
        return self.docs

    def tokens(self, shard, offset, length):
        return self.flat[offset : offset + length]


def _store(seed=0, n=60, lengths=((5, 40), (20, 200), (3, 12))):
    """Documents of three domains with very different lengths."""
    rng = np.random.default_rng(seed)
    domains = rng.integers(0, 3, size=n)
    docs = [rng.integers(3, 99, size=rng.integers(*lengths[d])) for d in domains]
    return _Store(docs, domains)


def _input_domains(batch: Batch) -> np.ndarray:
    return batch.target_domains.numpy()  # every position of a training row is valid


def test_token_shares_follow_the_weights_not_document_counts():
    store = _store()
    weights = {"code": 0.5, "docs": 0.3, "math": 0.2}
    stream = train_batches(
        store, PackConfig(seq_len=63), 8, seed=3, mixture=[Segment(None, weights)]
    )
    for _ in range(60):
        next(stream)
    consumed = np.asarray(stream.consumed, dtype=float)
    share = consumed / consumed.sum()
    # within a couple of the longest documents (200 tokens) of 60 x 8 x 63 = 30,240 tokens
    assert np.allclose(share, [0.5, 0.3, 0.2], atol=2 * 202 / consumed.sum())
    # document counts are far from the token weights: math documents are short
    docs_seen = stream.state_dict()["mix"]["orders"]
    assert docs_seen  # the per-domain cursors are part of the state


def test_consumed_counts_every_input_token_once():
    store = _store(1)
    stream = train_batches(store, PackConfig(seq_len=31), 4, seed=0)
    batches = [next(stream) for _ in range(20)]
    assert sum(stream.consumed) == sum(int(b.valid.sum()) for b in batches) == 20 * 4 * 31


def test_a_domain_without_weight_is_never_sampled_and_visits_repeat_documents():
    rng = np.random.default_rng(2)
    domains = [0, 0, 1, 1, 2, 2]
    docs = [rng.integers(3, 99, size=10) for _ in domains]
    store = _Store(docs, domains, weights=[1, 3, 1, 1, 1, 1])
    weights = {"code": 0.5, "docs": 0.0, "math": 0.5}
    stream = train_batches(
        store, PackConfig(seq_len=11), 1, seed=0, mixture=[Segment(None, weights)]
    )
    seen = []
    for _ in range(40):
        b = next(stream)
        seen.extend(_input_domains(b).ravel().tolist())
    assert 1 not in seen
    # document 1 is visited three times per code epoch, document 0 once
    mix = stream.state_dict()["mix"]
    assert mix["orders"][0][0] >= 1  # code has been through at least one epoch of 4 visits


def test_stages_switch_at_their_boundary():
    store = _store(3)
    cfg = MixtureConfig.model_validate(
        {"weights": {"math": 1.0}, "stages": [{"until": 0.5, "weights": {"code": 1.0}}]}
    )
    budget = 40 * 4 * 31
    segments = resolve(cfg, budget, natural_shares(store))
    assert segments[0].end == budget // 2 and segments[1].end is None
    stream = train_batches(store, PackConfig(seq_len=31), 4, seed=0, mixture=segments)
    rows = np.concatenate([_input_domains(next(stream)).ravel() for _ in range(40)])
    # the switch comes at the first document boundary after the boundary: at most one
    # code document (< 40 tokens) of the second half is code
    first, second = rows[: budget // 2], rows[budget // 2 + 41 :]
    assert set(first.tolist()) == {0} and set(second.tolist()) == {2}


def test_natural_shares_and_pools_count_the_train_split():
    store = _store(4)
    pools = train_pools(store)
    docs = store.docs
    for i, d in enumerate(DOMAINS):
        assert pools[d] == int(docs["length"][docs["domain"] == i].sum())
    shares = natural_shares(store)
    assert abs(sum(shares.values()) - 1) < 1e-12


def _same(a: Batch, b: Batch) -> None:
    for f in fields(Batch):
        assert torch.equal(getattr(a, f.name), getattr(b, f.name)), f.name


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    raw=st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3).filter(lambda w: sum(w) > 0.1),
    until=st.floats(0.05, 0.95),
    row_len=st.integers(4, 40),
    batch_rows=st.integers(1, 3),
    before=st.integers(0, 30),
)
def test_a_mixed_stream_resumes_bitwise_from_any_state(
    seed, raw, until, row_len, batch_rows, before
):
    store = _store(seed % 11, n=30)
    present = {DOMAINS[d] for d in set(store.docs["domain"].tolist())}
    w = {d: (x if d in present else 0.0) for d, x in zip(DOMAINS, raw, strict=True)}
    if sum(w.values()) == 0:
        w = {d: (1.0 if d in present else 0.0) for d in DOMAINS}
    total = sum(w.values())
    weights = {d: x / total for d, x in w.items()}
    cfg = MixtureConfig.model_validate(
        {"weights": "natural", "stages": [{"until": until, "weights": weights}]}
    )
    budget = 40 * batch_rows * (row_len - 1)
    segments = resolve(cfg, budget, natural_shares(store))
    pack = PackConfig(seq_len=max(row_len - 1, 8))
    stream = train_batches(store, pack, batch_rows, seed, mixture=segments)
    for _ in range(before):
        next(stream)
    state = json.loads(json.dumps(stream.state_dict()))
    resumed = train_batches(store, pack, batch_rows, seed, cursor=state, mixture=segments)
    for _ in range(12):
        _same(next(resumed), next(stream))
    assert resumed.consumed == stream.consumed
