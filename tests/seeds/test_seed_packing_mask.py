"""Seed 003, section 3.2: the packed pair A=[BOS,cat,sleeps,EOS], B=[BOS,rain,stopped,EOS]
(8 tokens, 7 prediction rows): validity marked on the predicted token, and the 7 x 7
block-causal mask with M[4,3] = -inf, both returned by the project's functions (the runner
gives SDPA the boolean mask; the seed's additive M is 0 where it is True, -inf elsewhere).

(The label mask m = [1,1,1,0,1,1,1] itself is asserted in tests/tokens/test_packing.py.)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ledgerlm.model.attention import attention_mask
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
    allowed = attention_mask(batch.doc_ids, "isolated")[0, 0]
    assert allowed.shape == (7, 7)
    assert not allowed[4, 3]  # M[4,3] = -inf: B's BOS cannot read A's EOS
    assert allowed[4, 4]  # ... but reads itself
    assert allowed[3, :4].tolist() == [True] * 4  # A's EOS reads A's 0-3 (its label is ignored)
    readable = allowed.int().tolist()
    assert readable == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ]
    # m[3] = 0 is a different rule: the label mask does not isolate, the attention mask does
    assert batch.loss_mask[0, 3].item() is False
    cross = attention_mask(batch.doc_ids, "cross")[0, 0]
    assert cross[4, 3]


def test_the_boolean_mask_attends_as_the_seeds_additive_m():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 7, 8, generator=g)
    doc_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    mask = attention_mask(doc_ids, "isolated")
    M = torch.zeros(mask.shape).masked_fill(~mask, -math.inf)  # the seed's M
    torch.testing.assert_close(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=M),
    )
