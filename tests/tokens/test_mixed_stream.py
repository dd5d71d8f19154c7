"""The mixture sampler: token-level shares whatever the document lengths, dedup visits
composed in, stages switching at their boundary, and a bitwise resume from any state."""

import json
from dataclasses import fields

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_store import FakeTokenStore
from ledgerlm.config import MixtureConfig, PackConfig
from ledgerlm.mixture.schedule import Segment, resolve
from ledgerlm.tokens.loader import natural_shares, train_batches, train_pools
from ledgerlm.tokens.packing import Batch

BOS, EOS, PAD = 1, 2, 0
DOMAINS = ["code", "docs", "math"]


def _store(seed=0, n=60, lengths=((5, 40), (20, 200), (3, 12))):
    """Documents of three domains with very different lengths."""
    rng = np.random.default_rng(seed)
    domains = rng.integers(0, 3, size=n)
    docs = [rng.integers(3, 99, size=rng.integers(*lengths[d])) for d in domains]
    return FakeTokenStore(docs, domains, DOMAINS)


def _input_domains(batch: Batch) -> np.ndarray:
    return batch.target_domains.numpy()  # every position of a training row is valid


def test_token_shares_follow_the_weights_not_document_counts():
    store = _store()
    weights = {"code": 0.5, "docs": 0.3, "math": 0.2}
    stream = train_batches(
        store, PackConfig(seq_len=63), 8, seed=3, mixture=[Segment(None, weights)]
    )
    domain_of: dict[int, int] = {}  # segment id of each document read -> its domain
    for _ in range(60):
        b = next(stream)
        m = b.loss_mask.numpy()  # a supervised target is of its input's document
        segments, domains = b.doc_ids.numpy()[m], _input_domains(b)[m]
        domain_of.update(zip(segments.tolist(), domains.tolist(), strict=True))
    consumed = np.asarray(stream.consumed, dtype=float)
    share = consumed / consumed.sum()
    # within a couple of the longest documents (200 tokens) of 60 x 8 x 63 = 30,240 tokens
    assert np.allclose(share, [0.5, 0.3, 0.2], atol=2 * 202 / consumed.sum())
    # document counts are far from the token weights: drawn by tokens, a domain's
    # documents come in proportion to its weight over its mean document length (BOS +
    # ids + EOS: code 27.4, docs 105.7, math 10.35 tokens), so math, whose documents are
    # short, gets 48% of the documents for its 20% of the tokens, docs 7% for 30%
    read = np.bincount(list(domain_of.values()), minlength=3).astype(float)
    packed, domain = store.docs["length"] + 2, store.docs["domain"]
    mean_length = np.array([packed[domain == d].mean() for d in range(3)])
    expected = np.array([0.5, 0.3, 0.2]) / mean_length
    assert np.allclose(read / read.sum(), expected / expected.sum(), atol=0.01)
    assert read[2] / read.sum() > 0.45 and read[1] / read.sum() < 0.1
    # the per-domain cursors of the state count those documents: epochs x the domain's
    # documents + the position in its epoch, and the document in progress (segment id
    # state["segment"]) where it has given a supervised target yet
    state = stream.state_dict()
    per_epoch = np.bincount(domain, minlength=3)
    orders = zip(state["mix"]["orders"], per_epoch, strict=True)
    started = np.array([e * n + i for (e, i), n in orders])
    started[state["mix"]["domain"]] += state["segment"] in domain_of
    assert started.tolist() == read.tolist()


def test_consumed_counts_every_input_token_once():
    store = _store(1)
    stream = train_batches(store, PackConfig(seq_len=31), 4, seed=0)
    batches = [next(stream) for _ in range(20)]
    assert sum(stream.consumed) == sum(int(b.valid.sum()) for b in batches) == 20 * 4 * 31


def _visits_in_mixed_stream(batches: int) -> tuple[dict, list[int]]:
    """Six 10-token documents, two per domain, document 1 of dedup weight 3, read one
    12-token row (BOS + 10 ids + EOS) per batch with code and math weighted alike: the
    mixture state after ``batches`` batches, and how many times each document was read,
    told apart by its tokens."""
    rng = np.random.default_rng(2)
    domains = [0, 0, 1, 1, 2, 2]
    docs = [rng.integers(3, 99, size=10) for _ in domains]
    store = FakeTokenStore(docs, domains, DOMAINS, weights=[1, 3, 1, 1, 1, 1])
    weights = {"code": 0.5, "docs": 0.0, "math": 0.5}
    stream = train_batches(
        store, PackConfig(seq_len=11), 1, seed=0, mixture=[Segment(None, weights)]
    )
    visits = [0] * len(docs)
    for _ in range(batches):
        row = next(stream)
        tokens = np.append(row.input_ids.numpy().ravel(), row.targets.numpy().ravel()[-1])
        # a row is one whole document: rows and documents are both 12 tokens long
        assert tokens[0] == BOS and tokens[-1] == EOS
        (doc,) = [i for i, d in enumerate(docs) if np.array_equal(tokens[1:-1], d)]
        visits[doc] += 1
    return stream.state_dict()["mix"], visits


def test_a_domain_without_weight_is_never_sampled_and_visits_repeat_documents():
    # 40 documents read, 20 per weighted domain (every document is 12 tokens). A code
    # epoch is 4 visits (document 0 once, document 1 three times): 5 epochs. A math epoch
    # is 2 visits (documents 4 and 5 once each): 10 epochs. Docs (weight 0) is never read.
    mix, visits = _visits_in_mixed_stream(40)
    assert visits == [5, 15, 0, 0, 10, 10]
    assert mix["orders"] == [[5, 0], [0, 0], [10, 0]]  # every epoch ended, none begun


def test_visit_counts_without_dedup_weights_would_fail_the_check(monkeypatch):
    """Mutation check: a mixed stream that reads each document once per epoch, its dedup
    weight dropped, gives document 1 10 visits (10 code epochs), not 15."""
    import ledgerlm.tokens.loader as loader

    monkeypatch.setattr(loader, "_visits", lambda weights: np.ones(len(weights), np.int64))
    mix, visits = _visits_in_mixed_stream(40)
    assert visits == [10, 10, 0, 0, 10, 10] and mix["orders"][0] == [10, 0]


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
