"""Attention masks and the attention call.

On CPU (and by default) attention is SDPA with an explicit boolean mask:
True means "may attend". Isolation between packed documents comes from the
mask alone: ``M[i, j] = j <= i and c_i == c_j``. EOS tokens and position-id
resets do not isolate documents.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention_mask(doc_ids: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T) document ids -> (B, 1, T, T) boolean mask for SDPA."""
    _, t = doc_ids.shape
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    if mode == "cross":
        return causal.expand(doc_ids.shape[0], 1, t, t)
    if mode == "isolated":
        same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T, T)
        return (same_doc & causal)[:, None]
    raise ValueError(f"unknown attention mode {mode!r} (isolated | cross)")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q, k, v: (B, nh, T, hs); mask: (B, 1, T, T) bool. Every row must allow itself."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
