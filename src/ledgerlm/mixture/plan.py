"""The plan of a mixture before training: per domain the unique pool S_i (train tokens
of the data version), the weight p_i, the expected tokens E[D_i] = p_i D for the run's
token budget D, and the exposure multiple e_i = E[D_i] / S_i (epochs over the domain's
unique tokens). A domain repeated more than ``max_epochs`` times is flagged: repeated
tokens are worth less than fresh ones, and the more so the more they repeat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ledgerlm.config import MixtureConfig
from ledgerlm.errors import ArgumentError
from ledgerlm.mixture.schedule import Segment, expected_tokens

#: Above this exposure a domain is flagged: the recipe's ``data.mixture.max_epochs``
#: default, for a plan made without a recipe.
DEFAULT_MAX_EPOCHS: float = MixtureConfig.model_fields["max_epochs"].default
#: The weights of a plan made without a recipe must sum to 1 within this.
WEIGHT_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class DomainPlan:
    domain: str
    pool: int  # S_i: unique tokens of the domain in the train split
    weight: float  # p_i: share of the training tokens (over the whole run, stages averaged)
    expected_tokens: float  # E[D_i]
    exposure: float  # e_i = E[D_i] / S_i (inf when the pool is empty but tokens are asked)
    over: bool  # exposure above the plan's max_epochs


@dataclass(frozen=True)
class MixturePlan:
    budget_tokens: int
    max_epochs: float
    domains: list[DomainPlan]
    segments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """One line per domain repeated more than ``max_epochs`` times."""
        return [
            f"domain {d.domain}: {d.expected_tokens:,.0f} tokens from a pool of {d.pool:,} "
            f"is {d.exposure:.2f} epochs (above {self.max_epochs:g})"
            for d in self.domains
            if d.over
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_tokens": self.budget_tokens,
            "max_epochs": self.max_epochs,
            "domains": [{**asdict(d), "exposure": _finite(d.exposure)} for d in self.domains],
            "segments": self.segments,
            "warnings": self.warnings,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def exposure(weight: float, budget_tokens: float, pool: float) -> float:
    """e = p D / S: how many times the expected tokens cover the unique pool."""
    asked = weight * budget_tokens
    if pool <= 0:
        return math.inf if asked > 0 else 0.0
    return asked / pool


def plan_mixture(
    pools: Mapping[str, float],
    weights: Mapping[str, float],
    budget_tokens: float,
    max_epochs: float | None = None,
) -> MixturePlan:
    """The plan of one mixture ``weights`` (domain -> p_i, summing to 1) over ``pools``
    (domain -> S_i, whole tokens) for a budget of ``budget_tokens`` training tokens (a
    positive number, whole tokens counted), flagging above ``max_epochs`` (default
    ``DEFAULT_MAX_EPOCHS``). Errors are ``ArgumentError``s naming the argument at fault."""
    total = sum(weights.values())
    if abs(total - 1) > WEIGHT_SUM_TOLERANCE:
        raise ArgumentError("{weights}: the weights sum to {total:g}, not 1", total=total)
    unknown = sorted(set(weights) - set(pools))
    if unknown:
        raise ArgumentError("{weights}: no pool given for {unknown}", unknown=", ".join(unknown))
    if not math.isfinite(budget_tokens) or budget_tokens <= 0:
        raise ArgumentError(
            "{budget_tokens}: {given:g} is not a positive number", given=budget_tokens
        )
    return plan_segments(
        {d: int(s) for d, s in pools.items()},
        [Segment(None, dict(weights))],
        int(budget_tokens),
        DEFAULT_MAX_EPOCHS if max_epochs is None else max_epochs,
    )


def plan_segments(
    pools: Mapping[str, int],
    segments: list[Segment],
    budget_tokens: int,
    max_epochs: float = DEFAULT_MAX_EPOCHS,
) -> MixturePlan:
    """The plan of a staged mixture: expected tokens summed over the segments; the
    weight shown per domain is its share of the whole budget."""
    per_segment = expected_tokens(segments, budget_tokens)
    names = sorted(set(pools) | {d for seg in segments for d in seg.weights})
    rows = []
    for d in names:
        asked = sum(seg.get(d, 0.0) for seg in per_segment)
        weight = asked / budget_tokens if budget_tokens else 0.0
        e = exposure(weight, budget_tokens, pools.get(d, 0))
        rows.append(DomainPlan(d, int(pools.get(d, 0)), weight, asked, e, e > max_epochs))
    shown = [
        {**seg.to_dict(), "expected_tokens": tokens}
        for seg, tokens in zip(segments, per_segment, strict=True)
    ]
    return MixturePlan(int(budget_tokens), float(max_epochs), rows, shown)
