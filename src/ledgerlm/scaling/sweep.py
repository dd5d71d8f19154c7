"""Scaling sweeps (requirement S1): plan a grid of model sizes N and token budgets D with an
explicit tuning rule. Pure planning: no ledger, no runner, no torch. Running a plan on
one data version and reading its points back from the ledger is ``ledgerlm.lab.sweep``.

**What N counts.** N is every weight the forward pass multiplies by, once: the
blocks, the final norm and the output head (``d_model x vocab``, counted even when
it is tied to the embedding), but not the token-embedding lookup, which costs no
FLOPs. That is the N of C = 6 N D (``ledgerlm.shape.param_count``). For a tied
model it equals ``GPT.num_params()``; for an untied one
``GPT.num_params(non_embedding=True)``.

**Shape rule.** Width ``d_model`` is a multiple of 16 with ``16 <= d_model /
n_layers <= 256`` (the aspect rule ``d_model = 64 x n_layers``, within a factor 4:
Kaplan et al. 2020 find the loss moves by a few percent at most over that range);
heads are 32 wide when 32 divides ``d_model``, else 16 (so every head dimension is
even, as RoPE needs). Of all such shapes the plan takes the one whose N is closest
to the target (in log ratio) and, among the shapes within one percentage point of
that closest one, the one nearest ``d_model = 64 x n_layers``. A target no shape
comes within 25% of is an error. With a 512-token vocabulary the realized N is
within 8% of the target from 2e5 to 1e6, 4% to 1e7 and 1.5% beyond (tested);
below ~2e5 the shapes are too coarse for that, and the realized N is what counts.
``ffn_mult``, ``tie_embeddings`` and every other model setting stay the base
recipe's.

**Token rule.** One optimizer step consumes ``micro_batch_rows x grad_accum x
seq_len`` token positions; ``max_steps = ceil(D / that)``, and the realized D is
``max_steps`` steps of it (the ledger's token counter, which leaves out padding,
is what ``ledgerlm.lab.sweep.sweep_points`` reads back). For an isoFLOP budget C,
D = C / (6 N) with the realized N.

**Tuning rule** (recorded in every run's overrides and ``sweep`` event):
``fixed`` keeps the base recipe's ``train.lr``; ``sqrt`` uses ``lr x
sqrt(d_base / d_model)``. Warmup keeps the base recipe's share of its schedule
(``round(warmup_steps / max_steps x max_steps')``, at least 1 step when the base
warms up); the evaluation interval is ``ceil(max_steps / 8)`` (the last state is
always evaluated); ``eval.stop_at_target = false`` and no token or wall-time budget,
so every curve runs its full budget and stays whole in the ledger.

**Sweep ids.** ``sweep_id`` is ``<recipe>-sweep-<6 hex>`` of ``plan_digest`` (the base
recipe's digest and every point's overrides): the same plan always gets the same id,
which is how running a sweep again continues it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ledgerlm.config import Recipe, apply_overrides, recipe_from_dict
from ledgerlm.scaling.law import KAPPA
from ledgerlm.shape import param_count, tokens_per_update

WIDTH_STEP = 16  # d_model is a multiple of this
ASPECT = 64  # d_model ~ ASPECT x n_layers ...
ASPECT_BAND = (16, 256)  # ... within these bounds of d_model / n_layers
MAX_LAYERS = 256
MAX_WIDTH = 16_384
TIE_MARGIN = 0.01  # shapes within this log distance of the closest N count as ties
MAX_MISS = math.log(1.25)  # no shape within 25% of the target: an error
EVALS_PER_RUN = 8
LR_RULES = ("fixed", "sqrt")
SWEEP_ID = re.compile(r"(.+-sweep-[0-9a-f]{6})")  # a run of the sweep is named <id>-<point>

SHAPE_RULE = (
    "d_model a multiple of 16 with 16 <= d_model/n_layers <= 256; head dim 32 (16 when 32 "
    "does not divide d_model); N closest to the target, ties (within 1 point) to "
    "d_model = 64 x n_layers"
)
N_DEFINITION = "blocks + final norm + output head (d_model x vocab); token embedding excluded"


class SweepError(ValueError):
    """A sweep that cannot be planned or read; the message is one line."""


# -- shapes ---------------------------------------------------------------------------


def heads_for(d_model: int) -> int:
    """Heads 32 wide when 32 divides ``d_model``, else 16 wide (even, as RoPE needs)."""
    return d_model // 32 if d_model % 32 == 0 else d_model // 16


@dataclass(frozen=True)
class Shape:
    d_model: int
    n_layers: int
    n_heads: int
    N: int


def _widths(n_layers: int) -> tuple[int, int]:
    lo = max(WIDTH_STEP, math.ceil(ASPECT_BAND[0] * n_layers / WIDTH_STEP) * WIDTH_STEP)
    hi = min(MAX_WIDTH, ASPECT_BAND[1] * n_layers // WIDTH_STEP * WIDTH_STEP)
    return lo, hi


def _near(target: int, n_layers: int, vocab: int, ffn_mult: float) -> list[int]:
    """The widths (at this depth) whose N brackets the target; N grows with width."""
    lo, hi = _widths(n_layers)
    if lo > hi:
        return []
    a, b = lo // WIDTH_STEP, hi // WIDTH_STEP  # search over k with d_model = 16 k
    while a < b:
        mid = (a + b) // 2
        if param_count(mid * WIDTH_STEP, n_layers, vocab, ffn_mult) < target:
            a = mid + 1
        else:
            b = mid
    return [WIDTH_STEP * k for k in sorted({a, max(a - 1, lo // WIDTH_STEP)})]


def smallest_shape(vocab_size: int, ffn_mult: float = 8 / 3) -> Shape:
    d = _widths(1)[0]
    return Shape(d, 1, heads_for(d), param_count(d, 1, vocab_size, ffn_mult))


def choose_shape(target: int, vocab_size: int, ffn_mult: float = 8 / 3) -> Shape:
    """The shape the rule in the module docstring picks for a target N."""
    if target < 1:
        raise SweepError(f"size {target}: a parameter count must be positive")
    found: list[tuple[float, float, int, int, int]] = []
    for n_layers in range(1, MAX_LAYERS + 1):
        for d in _near(target, n_layers, vocab_size, ffn_mult):
            n = param_count(d, n_layers, vocab_size, ffn_mult)
            miss = abs(math.log(n / target))
            found.append((miss, abs(math.log(d / (ASPECT * n_layers))), n_layers, d, n))
    best = min(f[0] for f in found)
    near = [f for f in found if f[0] <= best + TIE_MARGIN]
    _, _, n_layers, d, n = min(near, key=lambda f: (f[1], f[0], f[2], f[3]))
    if best > MAX_MISS:
        small = smallest_shape(vocab_size, ffn_mult)
        if target < small.N:
            raise SweepError(
                f"size {target:,} is below the smallest shape (d_model={small.d_model}, "
                f"n_layers=1: N = {small.N:,} at vocab {vocab_size:,}; N counts "
                f"{N_DEFINITION})"
            )
        raise SweepError(
            f"size {target:,}: no shape comes within 25% (closest: d_model={d}, "
            f"n_layers={n_layers}, N = {n:,})"
        )
    return Shape(d, n_layers, heads_for(d), n)


# -- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanPoint:
    """One run of a sweep: the overrides that make it from the base recipe, and its
    realized N (parameters, as counted above), D (token positions) and C = 6 N D."""

    name: str
    overrides: tuple[str, ...]
    N: int
    D: int
    C: float
    target_N: int
    target_D: int | None
    target_C: float | None
    d_model: int
    n_layers: int
    n_heads: int
    max_steps: int
    lr: float
    rule: dict[str, Any] = field(compare=False)

    def recipe(self, base: Recipe, name: str | None = None) -> Recipe:
        """The base recipe with this point's overrides (and ``name``, when given)."""
        tree = apply_overrides(base.to_dict(), list(self.overrides))
        tree["name"] = name or f"{base.name}-{self.name}"
        return recipe_from_dict(tree, f"sweep point {self.name}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["overrides"] = list(self.overrides)
        return out


def _short(x: float) -> str:
    """3 significant digits with a k/M/G/T suffix: 200080 -> '200k'."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if abs(x) >= scale or scale == 1:
            return f"{float(f'{x / scale:.3g}'):g}{suffix}"
    raise AssertionError  # pragma: no cover


def _rule(base: Recipe, lr_rule: str, evals_per_run: int, tps: int) -> dict[str, Any]:
    t = base.train
    lr = {
        "fixed": "lr = base lr",
        "sqrt": "lr = base lr x sqrt(base d_model / d_model)",
    }[lr_rule]
    return {
        "lr_rule": lr_rule,
        "lr": lr,
        "base_lr": t.lr,
        "base_d_model": base.model.d_model,
        "warmup": f"base share of the schedule ({t.warmup_steps}/{t.max_steps} steps), "
        "at least 1 step when the base warms up",
        "eval": f"every ceil(max_steps / {evals_per_run}) steps and at the end; "
        "stop_at_target = false; no token or wall-time budget",
        "shape": SHAPE_RULE,
        "N": N_DEFINITION,
        "tokens_per_step": tps,
        "kappa": KAPPA,
    }


def _overrides(base: Recipe, shape: Shape, max_steps: int, lr: float, evals: int) -> list[str]:
    t = base.train
    out = [
        f"model.d_model={shape.d_model}",
        f"model.n_layers={shape.n_layers}",
        f"model.n_heads={shape.n_heads}",
        f"train.max_steps={max_steps}",
        f"train.lr={lr!r}",
    ]
    if t.schedule_unit == "tokens":
        tokens = max_steps * tokens_per_update(base)
        share = t.warmup_tokens / (t.schedule_tokens or 1)
        out += [f"train.schedule_tokens={tokens}", f"train.warmup_tokens={round(share * tokens)}"]
    else:
        warmup = round(t.warmup_steps / t.max_steps * max_steps)
        if t.warmup_steps:
            warmup = max(1, warmup)
        out.append(f"train.warmup_steps={min(warmup, max_steps)}")
    out += [
        f"eval.every_steps={math.ceil(max_steps / evals)}",
        "eval.every_tokens=0",
        "eval.stop_at_target=false",
        "eval.budget_tokens=0",
        "eval.budget_seconds=0",
    ]
    return out


def _positive(values: Sequence[float] | None, what: str) -> list[float]:
    out = list(values or [])
    for v in out:
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise SweepError(f"{what}: {v!r} is not a positive number")
    return out


def plan(
    base: Recipe,
    sizes: Sequence[int],
    tokens: Sequence[int] | None = None,
    flops: Sequence[float] | None = None,
    vocab_size: int | None = None,
    *,
    lr_rule: str = "fixed",
    evals_per_run: int = EVALS_PER_RUN,
) -> list[PlanPoint]:
    """The grid sizes x tokens (each size trained on each token budget) or sizes x
    flops (isoFLOP: each size gets D = C / (6 N) for each budget C), in that order.

    ``vocab_size`` defaults to the recipe's ``tokenizer.vocab_size``. Deterministic: the
    same inputs give the same points. Raises ``SweepError`` (one line) for a point no
    shape or step count can honour.
    """
    sizes_ = _positive(sizes, "sizes")
    tokens_ = _positive(tokens, "tokens")
    flops_ = _positive(flops, "flops")
    if not sizes_:
        raise SweepError("no sizes: give at least one target parameter count")
    if bool(tokens_) == bool(flops_):
        raise SweepError("give token budgets or FLOP budgets (isoFLOP), exactly one of the two")
    if lr_rule not in LR_RULES:
        raise SweepError(f"lr rule {lr_rule!r}: choose one of {', '.join(LR_RULES)}")
    if evals_per_run < 1:
        raise SweepError(f"evals_per_run must be >= 1, got {evals_per_run}")
    if base.train.init_from:
        raise SweepError("a sweep trains every size from scratch; the base sets train.init_from")
    vocab = int(vocab_size or base.tokenizer.vocab_size)
    tps = tokens_per_update(base)
    rule = _rule(base, lr_rule, evals_per_run, tps)
    ffn = base.model.ffn_mult
    shapes = [(round(n), choose_shape(round(n), vocab, ffn)) for n in sizes_]

    wanted: list[tuple[int, Shape, float, int | None, float | None]] = []
    if tokens_:
        for target_n, shape in shapes:
            for d in tokens_:
                wanted.append((target_n, shape, d, round(d), None))
    else:
        for c in flops_:
            for target_n, shape in shapes:
                wanted.append((target_n, shape, c / (KAPPA * shape.N), None, float(c)))

    points: list[PlanPoint] = []
    seen: dict[tuple[int, int, int], PlanPoint] = {}
    for target_n, shape, d_want, target_d, target_c in wanted:
        what = f"{_short(target_c)} FLOPs at N = {shape.N:,}" if target_c else f"{d_want:,.0f}"
        if d_want < tps:
            raise SweepError(
                f"tokens {what}: less than one optimizer step ({tps:,} = micro_batch_rows "
                f"{base.train.micro_batch_rows} x grad_accum {base.train.grad_accum} x "
                f"seq_len {base.pack.seq_len}); raise the budget or shrink the batch"
            )
        max_steps = math.ceil(d_want / tps - 1e-9)
        d = max_steps * tps
        if math.log(d / d_want) > MAX_MISS:
            raise SweepError(
                f"tokens {what}: {max_steps} whole steps of {tps:,} tokens give {d:,} "
                f"(+{100 * (d / d_want - 1):.0f}%, more than 25%); raise the budget or "
                "shrink the batch"
            )
        lr = base.train.lr
        if lr_rule == "sqrt":
            lr = lr * math.sqrt(base.model.d_model / shape.d_model)
        name = f"N{_short(shape.N)}-D{_short(d)}"
        point = PlanPoint(
            name=name,
            overrides=tuple(_overrides(base, shape, max_steps, lr, evals_per_run)),
            N=shape.N,
            D=d,
            C=KAPPA * shape.N * d,
            target_N=target_n,
            target_D=target_d,
            target_C=target_c,
            d_model=shape.d_model,
            n_layers=shape.n_layers,
            n_heads=shape.n_heads,
            max_steps=max_steps,
            lr=lr,
            rule=rule,
        )
        key = (shape.d_model, shape.n_layers, max_steps)
        if key in seen:
            raise SweepError(
                f"two grid entries give the same run {name} (d_model={shape.d_model}, "
                f"n_layers={shape.n_layers}, {max_steps} steps); drop one"
            )
        seen[key] = point
        points.append(point)
    return points


# -- sweep ids ------------------------------------------------------------------------


def plan_digest(base: Recipe, points: Sequence[PlanPoint]) -> str:
    """A hash of what determines a sweep's runs: the base recipe (its seed included) and
    every point's overrides (the grid and the tuning rule), in order."""
    blob = json.dumps([base.digest(), [list(p.overrides) for p in points]])
    return hashlib.sha256(blob.encode()).hexdigest()


def sweep_id(base: Recipe, points: Sequence[PlanPoint]) -> str:
    """``<recipe>-sweep-<6 hex of plan_digest>``: the same plan always gets the same id,
    so running the same sweep again continues it. Every run of the sweep is named with
    it as a prefix."""
    return f"{base.name}-sweep-{plan_digest(base, points)[:6]}"
