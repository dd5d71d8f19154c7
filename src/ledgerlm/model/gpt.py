"""A Llama-style decoder in one readable file: RMSNorm, RoPE, SwiGLU, no biases."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ledgerlm.config import ModelConfig
from ledgerlm.model.attention import AttentionSpec, attend, attention_spec

# What a layer receives: an AttentionSpec, or a (B, 1, T, T) bool mask (the SDPA path).
Attn = torch.Tensor | AttentionSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(
    position_ids: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, ...]:
    """cos/sin of shape (B, 1, T, hs/2) for arbitrary (e.g. per-document) positions."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=position_ids.device) / head_dim)
    angles = position_ids[:, None, :, None].float() * inv_freq  # (B, 1, T, hs/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of each head, as Llama does."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], mask: Attn):
        b, t, d = x.shape
        q, k, v = (
            w(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )  # (B, nh, T, hs)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        y = attend(q, k, v, mask)  # (B, nh, T, hs)
        return self.wo(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = ffn_hidden(cfg)
        self.w_gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...], mask: Attn):
        x = x + self.attn(self.attn_norm(x), rope, mask)
        return x + self.mlp(self.mlp_norm(x))


def ffn_hidden(cfg: ModelConfig) -> int:
    """SwiGLU width rounded up to a multiple of 16."""
    return 16 * math.ceil(cfg.ffn_mult * cfg.d_model / 16)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, std) weights; residual output projections scaled by depth (GPT-2)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = (
                    1 / math.sqrt(2 * self.cfg.n_layers)
                    if name.endswith(("wo.weight", "w_down.weight"))
                    else 1
                )
                nn.init.normal_(p, mean=0.0, std=std * scale)

    def attention_spec(self, doc_ids: torch.Tensor, mode: str) -> AttentionSpec:
        """The batch's attention backend and mask, built once for all layers.

        Follows ``cfg.attention_backend`` and the device of ``doc_ids`` (see
        ``ledgerlm.model.attention``); pass the result to ``forward`` as ``mask``.
        """
        head_dim = self.cfg.d_model // self.cfg.n_heads
        return attention_spec(doc_ids, mode, self.cfg.attention_backend, head_dim)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Attn
    ) -> torch.Tensor:
        """(B, T) ids and positions, and the attention -> (B, T, V) logits.

        ``mask``: an AttentionSpec (``attention_spec``) or a (B, 1, T, T) bool SDPA mask.
        """
        rope = rope_tables(position_ids, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta)
        x = self.embed(input_ids)  # (B, T, d)
        for block in self.blocks:
            x = block(x, rope, mask)
        return self.lm_head(self.norm(x))  # (B, T, V)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if non_embedding else n
