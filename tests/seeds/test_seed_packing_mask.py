"""Seed 003, section 3.2: the packed pair A=[BOS,cat,sleeps,EOS], B=[BOS,rain,stopped,EOS]
(8 tokens, 7 prediction rows): validity marked on the predicted token, and the 7 x 7
block-causal mask M with M[4,3] = -inf, both returned by the project's functions.

(The label mask m = [1,1,1,0,1,1,1] itself is asserted in tests/tokens/test_packing.py.)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ledgerlm.model.attention import additive_mask, attention_mask
from ledgerlm.tokens.packing import make_batch, pack_documents, target_validity

BOS, EOS, PAD = 1, 2, 0
CAT, SLEEPS, RAIN, STOPPED = 10, 11, 12, 13


def _packed_pair() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    docs = [(np.array([CAT, SLEEPS]), 0), (np.array([RAIN, STOPPED]), 0)]
    (row,) = list(pack_documents(docs, 8, BOS, EOS, PAD))
    tokens, segments, _, valid = row
    assert tokens.tolist() == [BOS, CAT, SLEEPS, EOS, BOS, RAIN, STOPPED, EOS]
    return tokens, segments, valid


def test_validity_on_predicted_tokens_is_0_1_1_1_0_1_1_1_and_its_tail_is_the_label_mask():
    tokens, segments, valid = _packed_pair()
    predicted = target_validity(segments, valid)
    assert predicted.astype(int).tolist() == [0, 1, 1, 1, 0, 1, 1, 1]
    batch = make_batch(tokens[None], segments[None], valid[None])
    assert predicted[1:].tolist() == batch.loss_mask[0].tolist()  # "取 [1:] 才得到" m


def test_validity_on_predicted_tokens_marks_padding_by_validity_not_token_value():
    # Seed 003, 1.1.1: A = aaa padded to T = 4 with the id 0, which is also 'a'.
    segments = np.array([[0, 0, 0, -1], [1, 1, 1, 1]])
    valid = np.array([[True, True, True, False], [True] * 4])
    assert target_validity(segments, valid).astype(int).tolist() == [[0, 1, 1, 0], [0, 1, 1, 1]]


def test_seven_by_seven_block_causal_mask_forbids_m_4_3():
    tokens, segments, valid = _packed_pair()
    batch = make_batch(tokens[None], segments[None], valid[None])
    assert batch.doc_ids[0].tolist() == [0, 0, 0, 0, 1, 1, 1]  # the 7 inputs x = tokens[:-1]
    M = additive_mask(attention_mask(batch.doc_ids, "isolated"))[0, 0]
    assert M.shape == (7, 7)
    assert M[4, 3] == -math.inf  # B's BOS cannot read A's EOS
    assert M[4, 4] == 0  # ... but reads itself
    assert M[3, :4].tolist() == [0, 0, 0, 0]  # A's EOS reads A's 0-3 (its label is ignored)
    readable = (M == 0).int().tolist()
    assert readable == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ]
    assert bool(torch.isinf(M[M != 0]).all()) and bool((M[M != 0] < 0).all())
    # m[3] = 0 is a different rule: the label mask does not isolate, the attention mask does
    assert batch.loss_mask[0, 3].item() is False
    cross = additive_mask(attention_mask(batch.doc_ids, "cross"))[0, 0]
    assert cross[4, 3] == 0


def test_additive_mask_is_what_sdpa_adds_for_a_boolean_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 7, 8, generator=g)
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    mask = attention_mask(doc_ids, "isolated")
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask(mask)),
    )
