"""Serving benchmark: greedy decoding with the KV cache (``model.decode.generate``)
against decoding without one (``generate_uncached``: the whole prefix through the model
again for every new token), end to end, at a few context lengths.

The demo recipe's model shape (d=128, 4 layers, vocab 4096), random weights (time does
not depend on their values). For each context T: ``--new-tokens`` tokens generated
after a (``--batch``, T) prompt, repeats alternating cached, uncached, ... (the median
of each), and:

- **s / token**: the whole generation (the cached one includes its prefill) divided by
  the tokens generated (batch x new tokens);
- **speed-up**: uncached / cached seconds per token. Without the cache token k costs a
  forward over T + k positions; with it one position attending over T + k cached keys,
  so the ratio grows about linearly with T until attention dominates;
- **analytic FLOPs / token** of the cached step at the mean context (2N + 4 n_layers T d,
  ``model.decode.flops_per_token``) and the GFLOP/s it reaches.

    python bench/serving_cost.py                        # about a minute on 2 cores
    python bench/serving_cost.py --contexts 64 512 --batch 4 --threads 1 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from ledgerlm.config import load_recipe
from ledgerlm.model.decode import flops_per_token, generate, generate_uncached
from ledgerlm.model.gpt import GPT
from machine_load import cpu_jiffies, foreign_load, own_cpu

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(model: GPT, batch: int, context: int, new_tokens: int, repeat: int) -> dict:
    """Median seconds per generated token, cached and uncached (alternating, one warm-up
    each); the two must generate the same tokens."""
    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, model.vocab_size, (batch, context), generator=g)
    # the warm-up of both: their first tokens must agree
    same = torch.equal(generate(model, prompt, 4), generate_uncached(model, prompt, 4))
    times: dict[str, list[float]] = {"cached": [], "uncached": []}
    for _ in range(repeat):
        times["cached"].append(_timed(lambda: generate(model, prompt, new_tokens)))
        times["uncached"].append(_timed(lambda: generate_uncached(model, prompt, new_tokens)))
    per_token = {k: statistics.median(v) / (batch * new_tokens) for k, v in times.items()}
    flops = flops_per_token(model.cfg, model.vocab_size, context + (new_tokens + 1) / 2)
    return {
        "context": context,
        "cached_s_per_token": per_token["cached"],
        "uncached_s_per_token": per_token["uncached"],
        "speedup": per_token["uncached"] / per_token["cached"],
        "flops_per_token": flops.total,
        "cached_gflops": flops.total / per_token["cached"] / 1e9,
        "first_tokens_agree": same,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default=str(ROOT / "configs" / "demo.toml"))
    p.add_argument("--contexts", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3, help="timings per mode (alternating)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe)
    torch.manual_seed(0)
    model = GPT(recipe.model, recipe.tokenizer.vocab_size).eval()
    load, own = cpu_jiffies(), own_cpu()
    rows = [measure(model, args.batch, t, args.new_tokens, args.repeat) for t in args.contexts]
    foreign = foreign_load(load, own)
    out = {
        "model": f"d{recipe.model.d_model} L{recipe.model.n_layers} V{recipe.tokenizer.vocab_size}",
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "rows": rows,
        "foreign_load": foreign,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    load_text = "unknown" if foreign is None else f"{100 * foreign:.0f}%"
    print(
        f"{out['model']}, batch {args.batch}, {args.new_tokens} new tokens: {out['threads']} "
        f"threads; other processes used {load_text} of the CPU"
    )
    print("| context | cached s/token | uncached s/token | speed-up | FLOPs/token | GFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['context']} | {r['cached_s_per_token']:.3g} | {r['uncached_s_per_token']:.3g} "
            f"| {r['speedup']:.1f}x | {r['flops_per_token']:.3g} | {r['cached_gflops']:.2f} |"
        )
    if not all(r["first_tokens_agree"] for r in rows):
        print("warning: cached and uncached decoding disagreed on the first tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
