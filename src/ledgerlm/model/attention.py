"""Attention masks, the choice of attention backend, and the attention call.

Which pairs may attend is one predicate over segment ids ``c`` (``-1`` = padding):
``allowed(i, j) = j <= i and c_i == c_j`` in ``isolated`` mode, ``j <= i`` in
``cross`` mode. EOS tokens and position-id resets do not isolate documents.
Three backends compute it; ``attention_spec`` picks one per batch (from the
device, the mode and ``model.attention_backend``) and every layer reuses it:

- ``sdpa``: SDPA with an explicit (B, 1, T, T) boolean mask, True = "may attend".
  The CPU path, and the default everywhere but CUDA.
- ``flex``: ``isolated`` on CUDA: ``flex_attention`` with a block mask built once
  per batch from the same predicate (``document_mask_mod``), by a compiled
  ``create_block_mask`` on CUDA; 128 x 128 tiles that hold no allowed pair are
  skipped instead of computed and masked.
- ``causal``: ``cross`` on CUDA: SDPA with ``is_causal=True`` and no mask tensor.

Padding stays out of every real token's context in each backend: in ``isolated``
mode its segment id -1 matches no document; in ``cross`` mode padding only ever
trails a row (packing pads the last row at its end), so causality keeps it out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

MODES = ("isolated", "cross")
BACKENDS = ("auto", "sdpa", "flex")
FLEX_MIN_HEAD_DIM = 16  # flex_attention's CUDA kernels need head_dim >= 16


class AttentionSpec(NamedTuple):
    """What every layer of one forward needs: the backend and its mask, built once."""

    kind: str  # "sdpa" | "flex" | "causal"
    mask: torch.Tensor | None = None  # sdpa: (B, 1, T, T) bool
    block_mask: BlockMask | None = None  # flex


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


def document_mask_mod(doc_ids: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The isolated predicate as a flex ``mask_mod(b, h, q_idx, kv_idx)`` over (B, T) ids."""

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (kv_idx <= q_idx)

    return mask_mod


def choose_backend(
    device: torch.device | str, mode: str, requested: str = "auto", head_dim: int | None = None
) -> str:
    """The backend for a batch: "sdpa", "flex" or "causal" (see the module doc).

    ``auto`` takes the fused path (flex for isolated, causal for cross) on CUDA only,
    and keeps sdpa when the head is too narrow for flex's kernels; ``flex`` asks for
    the fused path on any device; ``sdpa`` always uses the explicit mask.
    """
    if mode not in MODES:
        raise ValueError(f"unknown attention mode {mode!r} (isolated | cross)")
    if requested not in BACKENDS:
        raise ValueError(f"unknown attention backend {requested!r} (auto | sdpa | flex)")
    if requested == "sdpa":
        return "sdpa"
    if requested == "auto":
        narrow = mode == "isolated" and head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM
        if torch.device(device).type != "cuda" or narrow:
            return "sdpa"
    return "flex" if mode == "isolated" else "causal"


def attention_spec(
    doc_ids: torch.Tensor, mode: str, backend: str = "auto", head_dim: int | None = None
) -> AttentionSpec:
    """Build the batch's attention once, on the device of ``doc_ids``, for all layers."""
    kind = choose_backend(doc_ids.device, mode, backend, head_dim)
    if kind == "sdpa":
        return AttentionSpec(kind, mask=attention_mask(doc_ids, mode))
    if kind == "causal":
        return AttentionSpec(kind)
    if doc_ids.device.type == "cpu" and torch.is_grad_enabled():
        raise RuntimeError(
            "attention_backend = 'flex' cannot train on CPU (flex_attention has no CPU "
            "backward); use 'auto' or 'sdpa'"
        )
    if head_dim is not None and head_dim < FLEX_MIN_HEAD_DIM:
        raise RuntimeError(
            f"attention_backend = 'flex' needs head_dim >= {FLEX_MIN_HEAD_DIM}, got {head_dim}"
        )
    b, t = doc_ids.shape
    build = _compiled_block_mask() if doc_ids.is_cuda else create_block_mask
    block_mask = build(document_mask_mod(doc_ids), b, None, t, t, device=doc_ids.device)
    return AttentionSpec(kind, block_mask=block_mask)


@functools.cache
def _compiled_block_mask() -> Callable[..., BlockMask]:
    """``create_block_mask`` compiled once (as torchtitan does): run eagerly it
    materialises the dense (B, 1, T, T) predicate before tiling it, gigabytes at T = 8k;
    compiled, it evaluates the mask function tile by tile. CPU keeps the eager build (its
    flex path is a forward-only check; training there takes the SDPA mask)."""
    return torch.compile(create_block_mask, dynamic=False)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: torch.Tensor | AttentionSpec
) -> torch.Tensor:
    """q, k, v: (B, nh, T, hs); attn: an AttentionSpec, or a (B, 1, T, T) bool mask for SDPA.

    Every row must allow itself.
    """
    if isinstance(attn, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn)
    if attn.kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn.mask)
    if attn.kind == "causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.is_cuda and not torch.compiler.is_compiling():
        return _fused_flex()(q, k, v, block_mask=attn.block_mask)
    # CPU (forward only, for checks) runs eagerly; inside a compiled model the outer
    # torch.compile fuses the call itself.
    return flex_attention(q, k, v, block_mask=attn.block_mask)


@functools.cache
def _fused_flex() -> Callable[..., torch.Tensor]:
    """flex_attention compiled on first use: eager flex materializes every score."""
    return torch.compile(flex_attention, dynamic=False)
