"""Incremental decoding with a KV cache, and the FLOPs of one generated token.

``Decoder`` runs a ``GPT``'s own modules (embedding, blocks, norm, head: the same
weights) over new tokens only, keeping every layer's keys and values so a generated
token attends over the cache instead of recomputing the prefix. A prefill of a (B, T)
context is one pass with a causal mask; each later step feeds (B, 1) tokens and needs
no mask (the new token may see every cached position). The maths is ``GPT.forward``'s
for a row holding one document (positions 0, 1, ...; ``cross`` and ``isolated`` masks
agree there); the tests check the logits against a full forward.

Cache layout: ``k`` and ``v`` are each one tensor (n_layers, B, n_heads, max_len,
head_dim), allocated at the first write with the keys' dtype and device (so autocast
and CUDA need nothing special) and filled in place; ``length`` positions are valid.

FLOPs of one generated token (``flops_per_token``), a multiply-add counted as 2:

    matmul    = 2 N            N as the scaling code counts it (``ledgerlm.shape``:
                               blocks + final norm + output head, embedding excluded)
    attention = 4 n_layers T d  QK^T (2 T d per layer: T dot products of length d,
                               summed over heads) plus AV (the same), where T is the
                               number of positions the token attends over: the cache
                               plus itself

The issue's "2 n_layers T d" is one of the two matmuls; both are counted here. A
decoded token sees every cached position, so there is no causal halving (training's
count in ``bench/train_step.py`` halves it). Norms, RoPE, softmax and the embedding
lookup are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ledgerlm.config import ModelConfig
from ledgerlm.model.gpt import GPT, Attention, apply_rope, rope_tables
from ledgerlm.shape import param_count


@dataclass(frozen=True)
class TokenFlops:
    """Forward FLOPs of one generated token at a context of ``context`` positions."""

    N: int
    context: float
    matmul: float  # 2 N
    attention: float  # 4 n_layers T d_model

    @property
    def total(self) -> float:
        return self.matmul + self.attention

    @property
    def per_param(self) -> float:
        """The analytic serving kappa: total / N (2 at no context, more with one)."""
        return self.total / self.N


def flops_per_token(cfg: ModelConfig, vocab_size: int, context: float) -> TokenFlops:
    """FLOPs of one decoded token attending over ``context`` positions (module doc)."""
    if context < 0:
        raise ValueError(f"context {context} must be >= 0")
    n = param_count(cfg.d_model, cfg.n_layers, vocab_size, cfg.ffn_mult)
    attention = 4.0 * cfg.n_layers * context * cfg.d_model
    return TokenFlops(N=n, context=context, matmul=2.0 * n, attention=attention)


class Decoder:
    """A model plus its KV cache: ``forward`` new tokens, get their logits.

    ``max_len`` bounds the positions one decoder holds (context plus generated tokens).
    Every row of the batch sits at the same position (no ragged prompts).
    """

    def __init__(self, model: GPT, max_len: int) -> None:
        if max_len < 1:
            raise ValueError(f"max_len {max_len} must be >= 1")
        self.model = model
        self.max_len = max_len
        self.length = 0
        self.k: torch.Tensor | None = None  # (L, B, nh, max_len, hs)
        self.v: torch.Tensor | None = None

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, t) tokens at positions length .. length+t-1 -> (B, t, V) logits."""
        model, cfg = self.model, self.model.cfg
        b, t = input_ids.shape
        start, end = self.length, self.length + t
        if end > self.max_len:
            raise ValueError(f"decoding to position {end} overflows the cache ({self.max_len})")
        if self.k is not None and self.k.shape[1] != b:
            raise ValueError(f"batch of {b} rows, the cache holds {self.k.shape[1]}")
        device = input_ids.device
        positions = torch.arange(start, end, device=device).expand(b, t)
        rope = rope_tables(positions, cfg.d_model // cfg.n_heads, cfg.rope_theta)
        mask = None  # one new token sees every cached position
        if t > 1:  # query i (position start + i) sees keys 0 .. start + i
            keys = torch.arange(end, device=device)
            mask = keys[None, :] <= torch.arange(start, end, device=device)[:, None]  # (t, end)
        x = model.embed(input_ids)  # (B, t, d)
        for layer, block in enumerate(model.blocks):
            x = x + self._attend(layer, block.attn, block.attn_norm(x), rope, mask, start)
            x = x + block.mlp(block.mlp_norm(x))
        self.length = end
        return model.lm_head(model.norm(x))  # (B, t, V)

    __call__ = forward

    def _attend(
        self,
        layer: int,
        attn: Attention,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, ...],
        mask: torch.Tensor | None,
        start: int,
    ) -> torch.Tensor:
        b, t, d = x.shape
        end = start + t
        q, k, v = (
            w(x).view(b, t, attn.n_heads, attn.head_dim).transpose(1, 2)
            for w in (attn.wq, attn.wk, attn.wv)
        )  # (B, nh, t, hs)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.k is None or self.v is None:
            n_layers = len(self.model.blocks)
            shape = (n_layers, b, attn.n_heads, self.max_len, attn.head_dim)
            self.k = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v = torch.zeros(shape, dtype=v.dtype, device=v.device)
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        keys, values = self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # (B, nh, end, hs)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, nh, t, hs)
        return attn.wo(y.transpose(1, 2).reshape(b, t, d))


@torch.no_grad()
def generate(model: GPT, context: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding with the KV cache: (B, T) context -> (B, T + new_tokens) ids."""
    decoder = Decoder(model, context.shape[1] + new_tokens)
    logits = decoder(context)
    out = [context]
    for i in range(new_tokens):
        token = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out.append(token)
        if i + 1 < new_tokens:
            logits = decoder(token)
    return torch.cat(out, dim=1)


@torch.no_grad()
def full_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """``GPT.forward`` over (B, T) ids, each row one document -> (B, T, V) logits."""
    b, t = ids.shape
    positions = torch.arange(t, device=ids.device).expand(b, t)
    doc_ids = torch.zeros(b, t, dtype=torch.long, device=ids.device)
    return model(ids, positions, model.attention_spec(doc_ids, "cross"))


@torch.no_grad()
def generate_uncached(model: GPT, context: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding without a cache: the whole prefix again for every token (the
    baseline ``bench/serving_cost.py`` compares the cache with)."""
    ids = context
    for _ in range(new_tokens):
        token = full_logits(model, ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, token], dim=1)
    return ids
