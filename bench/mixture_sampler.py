"""Mixture sampler benchmark: what token-level mixture sampling costs per training step
of the demo model, against natural sampling, measured in one run.

The demo recipe's model trains on its real token version (built or reused in a
workspace through the library) with two streams that feed the same shapes:

- **natural**: ``train_batches`` without a mixture (one seeded permutation per epoch);
- **mixed**: ``train_batches`` with a mixture (code 0.5, docs 0.2, math 0.3: documents
  drawn domain by domain, each from its own seeded epochs, the next domain the one
  furthest below its token share), which is the sampler ``data.mixture`` turns on.

Two figures, as ratios to the natural baseline measured in the same run:

- **sampler / step** (the headline, not noisy): the extra seconds per batch of the
  mixed stream over the natural one (each stream alone, many batches, alternating),
  times the batches of one update, divided by the median training step time;
- **end to end**: the median step time of a full ``Trainer.fit`` with each stream
  (repeats alternate natural, mixed, ...), mixed / natural - 1, with the min..max of
  the per-repeat ratios. Other processes on the machine swing this by a few percent
  either way; the first figure does not.

    python bench/mixture_sampler.py                    # about 2 minutes on 2 cores
    python bench/mixture_sampler.py --steps 20 --repeat 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ledgerlm.config import load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.mixture.schedule import Segment
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.loader import train_batches
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.workspace import Workspace

sys.path.insert(0, str(Path(__file__).parent))
from machine_load import cpu_jiffies, foreign_load, own_cpu

ROOT = Path(__file__).resolve().parents[1]
MIX = [Segment(None, {"code": 0.5, "docs": 0.2, "math": 0.3})]


class StepTimer:
    """Seconds from the end of one update to the end of the next."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last = 0.0

    def on_train_start(self, trainer: Any) -> None:
        self._last = time.perf_counter()

    def on_step_end(self, trainer: Any) -> None:
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now

    def on_train_end(self, trainer: Any) -> None:
        pass


def stream_seconds(store: TokenStore, recipe: Any, mixture: Any, batches: int) -> float:
    """Seconds per batch of one stream alone (no model)."""
    stream = train_batches(store, recipe.pack, recipe.train.micro_batch_rows, 0, None, mixture)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return (time.perf_counter() - start) / batches


def fit(store: TokenStore, recipe: Any, mixture: Any, steps: int, threads: int) -> float:
    """Median step seconds of one Trainer.fit over ``steps`` updates (first one dropped)."""
    cfg = recipe.train.model_copy(update={"max_steps": steps})
    torch.manual_seed(cfg.seed)
    model = GPT(recipe.model, store.vocab_size)
    stream = train_batches(store, recipe.pack, cfg.micro_batch_rows, cfg.seed, None, mixture)
    timer = StepTimer()
    trainer = Trainer(
        model, build_optimizer(model, cfg), cfg, stream, recipe.pack.attention, callbacks=[timer]
    )
    torch.set_num_threads(threads)
    trainer.fit()
    return statistics.median(timer.times[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default=str(ROOT / "configs" / "demo.toml"))
    p.add_argument("--workspace", default=None, help="reuse this workspace's versions")
    p.add_argument("--steps", type=int, default=16, help="updates per fit")
    p.add_argument("--repeat", type=int, default=3, help="fits per stream (alternating)")
    p.add_argument("--batches", type=int, default=400, help="batches per stream-only timing")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    recipe = load_recipe(args.recipe)
    threads = recipe.train.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(args.workspace or tmp)
        data = prepare_data(recipe.data, ws)
        store = TokenStore(build_tokens(data, recipe.tokenizer, ws).path)
        load, own = cpu_jiffies(), own_cpu()
        alone = {"natural": [], "mixed": []}
        for _ in range(3):
            for name, mix in (("natural", None), ("mixed", MIX)):
                alone[name].append(stream_seconds(store, recipe, mix, args.batches))
        steps = {"natural": [], "mixed": []}
        for _ in range(args.repeat):
            for name, mix in (("natural", None), ("mixed", MIX)):
                steps[name].append(fit(store, recipe, mix, args.steps, threads))
        foreign = foreign_load(load, own)
    per_batch = {k: statistics.median(v) for k, v in alone.items()}
    step = statistics.median(steps["natural"])
    extra = (per_batch["mixed"] - per_batch["natural"]) * recipe.train.grad_accum
    ratios = [m / n - 1 for m, n in zip(steps["mixed"], steps["natural"], strict=True)]
    out = {
        "recipe": recipe.name,
        "threads": threads,
        "natural_batch_seconds": per_batch["natural"],
        "mixed_batch_seconds": per_batch["mixed"],
        "natural_step_seconds": step,
        "mixed_step_seconds": statistics.median(steps["mixed"]),
        "sampler_share_of_step": extra / step,
        "end_to_end": statistics.median(ratios),
        "end_to_end_range": [min(ratios), max(ratios)],
        "foreign_load": foreign,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    load_text = "unknown" if foreign is None else f"{100 * foreign:.0f}%"
    print(f"{recipe.name}: {threads} threads; other processes used {load_text} of the CPU")
    print("| stream | s / batch (alone) | median s / step (fit) |")
    print("|---|---:|---:|")
    for k in ("natural", "mixed"):
        print(f"| {k} | {per_batch[k]:.6f} | {statistics.median(steps[k]):.4f} |")
    print(
        f"sampler / step: {100 * out['sampler_share_of_step']:+.3f}% of a step "
        f"(mixed - natural per batch x {recipe.train.grad_accum} batches / natural step)"
    )
    lo, hi = out["end_to_end_range"]
    print(
        f"end to end: {100 * out['end_to_end']:+.1f}% step time "
        f"(min..max over {args.repeat} repeats {100 * lo:+.1f}%..{100 * hi:+.1f}%)"
    )
    goal = "met" if out["sampler_share_of_step"] < 0.02 else "NOT met"
    print(f"goal (< 2% of a step): {goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
