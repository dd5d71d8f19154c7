"""A Llama-style decoder in one readable file: RMSNorm, RoPE, SwiGLU, no biases."""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ledgerlm.config import ModelConfig
from ledgerlm.model.attention import AttentionSpec, attend, attention_spec
from ledgerlm.model.dtensor import assign_full, is_sharded
from ledgerlm.model.head_loss import head_loss, head_losses

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
    """The decoder. Built on the ``meta`` device and then materialized, so a model too
    large for one device can be sharded before any memory is spent (``device="meta"``
    leaves it unmaterialized; ``materialize`` gives it memory and its initial weights).
    """

    def __init__(
        self, cfg: ModelConfig, vocab_size: int, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        # Recompute each block's activations in the backward pass instead of keeping
        # them (``train.activation_checkpointing``); the numbers are the same.
        self.checkpoint_blocks = False
        with torch.device("meta"):
            self.embed = nn.Embedding(vocab_size, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.tie()
        if torch.device(device).type != "meta":
            self.materialize(device)

    def tie(self) -> None:
        """Share the embedding with the output head (``tie_embeddings``)."""
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def materialize(self, device: torch.device | str) -> GPT:
        """Memory on ``device`` for every parameter (or its shard), then the initial
        weights (``reset_parameters``); the same weights at any device or sharding."""
        self.to_empty(device=device)
        if not is_sharded(self.embed.weight):  # a sharded model stays as placed
            self.tie()  # moving replaces parameters, so tied ones are tied again
        self.reset_parameters()
        return self

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, std) matrices, residual output projections scaled by depth (GPT-2);
        norms at one.

        Each matrix comes from its own generator, seeded by one draw from the global
        torch generator and the parameter's name, and is drawn whole on the CPU; a
        sharded parameter keeps its part. The weights therefore do not depend on the
        device, on the order parameters are visited, or on how they are sharded.
        """
        std = self.cfg.init_std
        base = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        for name, p in self.named_parameters():  # a tied weight is visited once
            if p.dim() != 2:
                p.fill_(1.0)
                continue
            depth = name.endswith(("wo.weight", "w_down.weight"))
            scale = 1 / math.sqrt(2 * self.cfg.n_layers) if depth else 1
            seed = hashlib.sha256(f"{base}:{name}".encode()).digest()[:8]
            g = torch.Generator().manual_seed(int.from_bytes(seed, "little") >> 1)
            full = torch.empty(p.shape, dtype=torch.float32).normal_(0, std * scale, generator=g)
            assign_full(p, full)

    def attention_spec(self, doc_ids: torch.Tensor, mode: str) -> AttentionSpec:
        """The batch's attention backend and mask, built once for all layers.

        Follows ``cfg.attention_backend`` and the device of ``doc_ids`` (see
        ``ledgerlm.model.attention``); pass the result to ``forward`` as ``mask``.
        """
        head_dim = self.cfg.d_model // self.cfg.n_heads
        return attention_spec(doc_ids, mode, self.cfg.attention_backend, head_dim)

    # One entry point for both results, chosen by keyword, on purpose: FSDP2 unshards
    # the root's parameters (embedding, final norm, head) in a pre-hook of ``forward``
    # and DDP syncs gradients around it; a second public method (``model.loss_sum``)
    # would bypass both, and the engine (``data_parallel``) only exposes ``forward``.
    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: Attn,
        *,
        targets: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) ids and positions, and the attention -> (B, T, V) logits.

        ``mask``: an AttentionSpec (``attention_spec``) or a (B, 1, T, T) bool SDPA mask.
        With ``targets`` and ``weights`` (B, T) it returns instead the loss numerator
        ``sum(weights * -log p(targets))`` (``head_loss``: a training step's, weights 0
        at unsupervised positions), scoring the head in chunks without the logits; with
        ``targets`` alone and no gradient, each target's -log p (B, T) (``head_losses``:
        an evaluation's), also in chunks.
        """
        x = self.hidden_states(input_ids, position_ids, mask)
        if targets is None:
            return self.lm_head(x)  # (B, T, V) logits
        if weights is None:
            if torch.is_grad_enabled():
                raise ValueError("targets need their weights (train.loss.objective_weights)")
            return head_losses(x, self.lm_head.weight, targets)  # (B, T) per-target losses
        return head_loss(x, self.lm_head.weight, targets, weights)  # () loss numerator

    def hidden_states(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Attn
    ) -> torch.Tensor:
        """The final normed hidden states (B, T, d) that the head scores; called inside
        ``forward`` (where FSDP has unsharded the root's parameters)."""
        rope = rope_tables(position_ids, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta)
        x = self.embed(input_ids)  # (B, T, d)
        for block in self.blocks:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, mask, use_reentrant=False)
            else:
                x = block(x, rope, mask)
        return self.norm(x)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.weight.numel() if non_embedding else n
