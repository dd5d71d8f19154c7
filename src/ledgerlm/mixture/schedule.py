"""Which weights are in force at each point of a run: a mixture's stages resolved
against the run's token budget.

A stage's ``until`` is a share of the budget (a float) or a count of training tokens
(an integer); resolved, every segment ends at a token count and the last one (the
recipe's ``weights``) runs to the end. ``"natural"`` resolves to the natural shares:
the tokens each domain holds in one natural epoch (dedup visits included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledgerlm.config import MixtureConfig


@dataclass(frozen=True)
class Segment:
    """These ``weights`` (domain -> share of training tokens) until ``end`` training
    tokens (``None``: to the end of the run); ``natural`` when they are the natural
    shares."""

    end: int | None
    weights: dict[str, float]
    natural: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"end": self.end, "weights": dict(self.weights), "natural": self.natural}


def resolve(cfg: MixtureConfig, budget_tokens: int, natural: Mapping[str, float]) -> list[Segment]:
    """The segments of a run of ``budget_tokens`` training tokens.

    ``natural`` holds the natural shares of every domain of the data (summing to 1);
    a named domain missing from it is an error naming the domains there are. Stages
    that end at or after the budget leave the later segments unreached, which is
    allowed (the plan shows them with no tokens).
    """
    known = sorted(natural)
    missing = sorted(cfg.named_domains() - set(natural))
    if missing:
        raise ValueError(
            f"data.mixture names domain(s) {', '.join(missing)} that the data version does "
            f"not have (domains: {', '.join(known) or 'none'})"
        )
    segments: list[Segment] = []
    last_end = 0
    for i, stage in enumerate(cfg.stages):
        if isinstance(stage.until, float):
            end = math.ceil(stage.until * budget_tokens)
        else:
            end = int(stage.until)
        if end <= last_end:
            raise ValueError(
                f"data.mixture.stages.{i}: until = {stage.until!r} ends at {end:,} tokens, "
                f"not after the previous stage ({last_end:,} tokens) for a budget of "
                f"{budget_tokens:,} tokens"
            )
        segments.append(_segment(end, stage.weights, natural))
        last_end = end
    segments.append(_segment(None, cfg.weights, natural))
    return segments


def _segment(
    end: int | None, weights: str | Mapping[str, float], natural: Mapping[str, float]
) -> Segment:
    if isinstance(weights, str):
        return Segment(end, {d: float(natural[d]) for d in sorted(natural)}, natural=True)
    return Segment(end, {d: float(weights.get(d, 0.0)) for d in sorted(natural)})


def expected_tokens(segments: list[Segment], budget_tokens: int) -> list[dict[str, float]]:
    """Per segment, the training tokens each domain is expected to get within a run of
    ``budget_tokens`` (E[D_i] = p_i x the segment's share of the budget)."""
    out, start = [], 0
    for seg in segments:
        end = budget_tokens if seg.end is None else min(seg.end, budget_tokens)
        length = max(0, end - start)
        out.append({d: p * length for d, p in seg.weights.items()})
        start = max(start, end)
    return out
