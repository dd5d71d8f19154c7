import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerlm.tokens.packing import IGNORE_INDEX, batches, make_batch, pack_documents, position_ids

BOS, EOS, PAD = 1, 2, 0


def test_seed_p2_label_mask_skips_the_document_boundary():
    # A=[BOS,cat,sleeps,EOS], B=[BOS,rain,stopped,EOS]: ids cat=10, sleeps=11, rain=12, stopped=13
    rows = list(
        pack_documents([(np.array([10, 11]), 0), (np.array([12, 13]), 0)], 8, BOS, EOS, PAD)
    )
    assert len(rows) == 1
    tokens, docs, _, valid = rows[0]
    assert tokens.tolist() == [BOS, 10, 11, EOS, BOS, 12, 13, EOS]
    b = make_batch(tokens[None], docs[None], valid[None])
    m = b.loss_mask[0].int().tolist()
    assert b.input_ids.shape == (1, 7)  # 8 tokens, 7 prediction rows
    assert m == [1, 1, 1, 0, 1, 1, 1]
    # "validity marked on predicted tokens": token i is a supervised target; its [1:] is m
    predicted = [0, *m]
    assert predicted == [0, 1, 1, 1, 0, 1, 1, 1]


def test_seed_p4_padding_is_marked_by_validity_not_token_value():
    # A=aaa, B=bcbc with a,b,c -> 0,1,2 and T=4: the pad value 0 is also the token 'a'
    tokens = np.array([[0, 0, 0, 0], [1, 2, 1, 2]])
    lengths = np.array([3, 4])
    valid = np.arange(4)[None, :] < lengths[:, None]
    docs = np.where(valid, np.array([[0], [1]]), -1)
    b = make_batch(tokens, docs, valid)
    assert int(valid.sum()) == 7 and valid.size == 8
    assert b.targets.numel() == 6  # prediction slots
    assert b.num_targets == 5  # supervised targets
    assert b.labels().tolist() == [[0, 0, IGNORE_INDEX], [2, 1, 2]]


def test_positions_reset_per_document():
    docs = np.array([[0, 0, 0, 1, 1, 2, -1, -1]])
    assert position_ids(docs, reset=True).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    assert position_ids(docs, reset=False).tolist() == [list(range(8))]


documents = st.lists(
    st.lists(st.integers(3, 50), min_size=0, max_size=40).map(np.array), min_size=1, max_size=12
)


@settings(max_examples=60, deadline=None)
@given(docs=documents, row_len=st.integers(2, 33))
def test_packing_conserves_tokens_and_never_trains_across_documents(docs, row_len):
    rows = list(pack_documents(((d, i % 3) for i, d in enumerate(docs)), row_len, BOS, EOS, PAD))
    tokens = np.concatenate([r[0][r[3]] for r in rows])
    expected = np.concatenate([np.r_[BOS, d, EOS] for d in docs])
    assert tokens.tolist() == expected.tolist()  # every token once, in order
    assert all(len(r[0]) == row_len for r in rows)
    assert all(r[3].all() for r in rows[:-1])  # only the last row may be padded

    (b,) = list(batches(rows, batch_rows=len(rows)))
    inp, tgt = b.input_ids[b.loss_mask], b.targets[b.loss_mask]
    # supervised pairs = consecutive tokens of one document that share a row
    seg = np.concatenate([r[1] for r in rows])
    pairs = sum(int(((r[1][:-1] == r[1][1:]) & r[3][:-1] & r[3][1:]).sum()) for r in rows)
    assert b.num_targets == pairs
    assert not torch.any((inp == EOS) & (tgt == BOS))  # EOS -> next BOS never trained
    assert len(set(seg[seg >= 0].tolist())) == len(docs)
