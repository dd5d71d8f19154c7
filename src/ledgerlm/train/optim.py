"""AdamW with parameter groups and a learning-rate schedule defined by optimizer step."""

from __future__ import annotations

import math

import torch

from ledgerlm.config import TrainConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices of linear layers only: no decay on norms, embeddings or biases."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = name.startswith("embed.") or name.startswith("lm_head.")
        (decay if p.dim() >= 2 and not is_embedding else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of the ``step``-th optimizer update (1-based).

    Linear warmup reaches peak at ``warmup_steps`` (half peak at half of it), then
    cosine decay to ``min_lr_ratio * lr`` at ``max_steps``.
    """
    if step < 1:
        raise ValueError("optimizer steps are counted from 1")
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return peak * step / cfg.warmup_steps
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
