"""Training-step benchmark: ledgerlm's optimizer steps against the CPU's own matmul peak.

One run measures both sides, because these machines are shared and noisy:

- the matmul peak: GFLOP/s of large square matmuls, fp32 and bf16, best of several;
- ledgerlm's throughput: tokens/s of full optimizer steps (``Trainer.train_step``:
  mask, forward, loss, backward, clipping, AdamW) on synthetic packed batches of the
  recipe's shape, eager and compiled, fp32 and bf16, for the demo model and a
  d=256, 4-layer model with the same batch shape.

Achieved FLOP/s counts useful work only (the usual 6N convention)::

    FLOPs per token = 6 * N + 6 * n_layers * d_model * seq_len
    N = non-embedding parameters + the output head (a d_model x vocab matmul)

The second term is attention's QK^T and AV: 2 matmuls x 2 FLOPs x seq_len x d_model
per layer forward, x3 for forward + backward, halved because the mask is causal.
SDPA with an explicit mask computes the masked half anyway, so that work is not
counted. Embedding lookups, norms, RoPE, softmax and the optimizer are not counted.

    python bench/train_step.py                         # everything, a few minutes on 2 cores
    python bench/train_step.py --models d256 --modes compiled --precisions bf16 --profile
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ledgerlm.config import ModelConfig, TrainConfig, load_recipe
from ledgerlm.model.gpt import GPT, ffn_hidden
from ledgerlm.tokens.packing import Batch, batches, pack_documents
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from machine_load import cpu_jiffies, foreign_load

ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Shape:
    """What a training step sees: the model, the vocabulary and the batch."""

    name: str
    model: ModelConfig
    vocab: int
    seq_len: int
    rows: int
    attention: str


def shapes(args: argparse.Namespace) -> dict[str, Shape]:
    """The demo recipe's model and batch, and a d=256, 4-layer model on the same batch."""
    demo = load_recipe(ROOT / "configs" / "demo.toml")
    rows = args.rows or demo.train.micro_batch_rows
    common = dict(
        vocab=demo.tokenizer.vocab_size,
        seq_len=demo.pack.seq_len,
        rows=rows,
        attention=args.attention or demo.pack.attention,
    )
    d256 = demo.model.model_copy(update={"d_model": 256, "n_layers": 4, "n_heads": 4})
    return {
        "demo": Shape(f"demo (d={demo.model.d_model})", demo.model, **common),
        "d256": Shape("d=256, 4 layers", d256, **common),
    }


def flops_per_token(model: GPT, seq_len: int) -> tuple[int, float]:
    """(N, FLOPs per trained token); see the module doc for the formula."""
    cfg = model.cfg
    n = model.num_params(non_embedding=True)
    if cfg.tie_embeddings:  # the head is a matmul with the embedding matrix: count it
        n += model.embed.weight.numel()
    return n, 6 * n + 6 * cfg.n_layers * cfg.d_model * seq_len


def matmul_peak(dtype: torch.dtype, size: int, repeat: int) -> float:
    """GFLOP/s of the best of ``repeat`` (size x size) @ (size x size) matmuls."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b  # first call: allocation, kernel selection
    best = min(_timed(lambda: a @ b) for _ in range(repeat))
    return 2 * size**3 / best / 1e9


def gemm_ceiling(shape: Shape, dtype: torch.dtype, repeat: int) -> float:
    """GFLOP/s of the step's own matmuls at their own shapes, best of ``repeat`` each.

    Per weight (K, N) of ``y = x @ W`` with M = rows x seq_len tokens: the forward
    (M,K)@(K,N), the input gradient (M,N)@(N,K) and the weight gradient (K,M)@(M,N).
    Thin matrices (K = d_model) run below the square-matmul peak, so this is the most
    a step of this model could reach if everything else were free.
    """
    cfg, m = shape.model, shape.rows * shape.seq_len
    d, h = cfg.d_model, ffn_hidden(cfg)
    # per block: q, k, v, o; gate, up, down (model/gpt.py); then the d x vocab head
    block = {(d, d): 4, (d, h): 2, (h, d): 1}
    weights = {kn: count * cfg.n_layers for kn, count in block.items()}
    weights[(d, shape.vocab)] = weights.get((d, shape.vocab), 0) + 1
    flops = seconds = 0.0
    for (k, n), count in weights.items():
        x, w, dy = (torch.randn(*s).to(dtype) for s in ((m, k), (k, n), (m, n)))
        xt, wt = x.t().contiguous(), w.t().contiguous()
        for a, b in ((x, w), (dy, wt), (xt, dy)):
            a @ b
            seconds += count * min(_timed(lambda a=a, b=b: a @ b) for _ in range(repeat))
            flops += count * 2 * m * k * n
    return flops / seconds / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def synthetic_batches(shape: Shape, count: int, seed: int = 0) -> list[Batch]:
    """Packed rows of random tokens from documents of random length (30..600 tokens),
    so an isolated mask has real document boundaries; no padding, like training."""
    rng = np.random.default_rng(seed)
    need = count * shape.rows * (shape.seq_len + 1)

    def docs():
        made = 0
        while made < need + 1000:
            n = int(rng.integers(30, 600))
            made += n + 2
            yield rng.integers(3, shape.vocab, size=n), 0

    rows = pack_documents(docs(), shape.seq_len + 1, 1, 2, 0, pad_last=False)
    out = list(itertools.islice(batches(rows, shape.rows), count))
    assert len(out) == count and all(b.input_ids.shape[0] == shape.rows for b in out)
    return out


def measure(shape: Shape, mode: str, precision: str, args: argparse.Namespace) -> dict:
    """tokens/s of the fastest of ``args.steps`` optimizer steps after ``args.warmup`` untimed
    ones (best of, like the matmul peak: the least disturbed by other load)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = GPT(shape.model, shape.vocab)
    cfg = TrainConfig(
        max_steps=10**6,
        micro_batch_rows=shape.rows,
        warmup_steps=0,
        precision=precision,
        compile=mode == "compiled",
    )
    data = itertools.cycle(synthetic_batches(shape, 4))
    trainer = Trainer(model, build_optimizer(model, cfg), cfg, data, shape.attention)
    warm = sum(_timed(trainer.train_step) for _ in range(args.warmup))
    load, own = cpu_jiffies(), sum(os.times()[:2])
    times = [_timed(trainer.train_step) for _ in range(args.steps)]
    foreign = foreign_load(load, own)
    if args.profile:
        profile(trainer, f"{shape.name} {mode} {precision}")
    n, per_token = flops_per_token(model, shape.seq_len)
    tokens_per_s = shape.rows * shape.seq_len / min(times)
    return {
        "model": shape.name,
        "mode": mode,
        "precision": precision,
        "n": n,
        "flops_per_token": per_token,
        "warmup_s": warm,
        "tokens_per_s": tokens_per_s,
        "gflops": per_token * tokens_per_s / 1e9,
        "foreign": foreign,
    }


def profile(trainer: Trainer, title: str) -> None:
    """Top operators of one step by self CPU time: where the step goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step()
    print(f"\n--- profile: {title}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=3, help="timed steps (the fastest is reported)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (compiles here)")
    parser.add_argument("--models", nargs="+", default=["demo", "d256"], choices=["demo", "d256"])
    parser.add_argument(
        "--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"]
    )
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=DTYPES)
    parser.add_argument("--rows", type=int, default=0, help="rows per step; 0 = the recipe's")
    parser.add_argument("--attention", choices=["isolated", "cross"], default=None)
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--matmul-repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0 = all cores")
    parser.add_argument("--profile", action="store_true", help="profile one step of each")
    args = parser.parse_args()

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    print(
        f"torch {torch.__version__}, {threads} threads, "
        f"cpu: {torch.backends.cpu.get_cpu_capability()}"
    )
    peak = {p: matmul_peak(DTYPES[p], args.matmul_size, args.matmul_repeat) for p in DTYPES}
    print("matmul peak (start): " + ", ".join(f"{p} {g:.1f} GFLOP/s" for p, g in peak.items()))

    results = []
    for key in args.models:
        shape = shapes(args)[key]
        for mode in args.modes:
            for precision in args.precisions:
                r = measure(shape, mode, precision, args)
                print(
                    f"  {r['model']} {mode} {precision}: {r['tokens_per_s']:,.0f} tok/s, "
                    f"warmup {r['warmup_s']:.1f} s",
                    flush=True,
                )
                results.append(r)

    # Measured again at the end, best of both: a peak disturbed by other load would
    # flatter every percentage below.
    end = {p: matmul_peak(DTYPES[p], args.matmul_size, args.matmul_repeat) for p in DTYPES}
    print("matmul peak (end):   " + ", ".join(f"{p} {g:.1f} GFLOP/s" for p, g in end.items()))
    peak = {p: max(peak[p], end[p]) for p in DTYPES}
    print()
    for key in args.models:
        shape = shapes(args)[key]
        r = next(r for r in results if r["model"] == shape.name)
        print(
            f"{shape.name}: N = {r['n']:,}, {r['flops_per_token'] / 1e6:.2f} MFLOP/token, "
            f"{shape.rows} rows x {shape.seq_len} tokens, {shape.attention} attention"
        )
        ceilings = {p: gemm_ceiling(shape, DTYPES[p], args.matmul_repeat) for p in DTYPES}
        print(
            "  its matmuls at their own shapes: "
            + ", ".join(
                f"{p} {g:.1f} GFLOP/s ({100 * g / peak[p]:.0f}% of peak)"
                for p, g in ceilings.items()
            )
        )
    print()
    print(
        "| model | mode | precision | tokens/s | GFLOP/s | % peak (same precision) "
        "| % bf16 peak | other load |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        load = "?" if r["foreign"] is None else f"{100 * r['foreign']:.0f}%"
        print(
            f"| {r['model']} | {r['mode']} | {r['precision']} | {r['tokens_per_s']:,.0f} | "
            f"{r['gflops']:.1f} | {100 * r['gflops'] / peak[r['precision']]:.0f}% | "
            f"{100 * r['gflops'] / peak['bf16']:.0f}% | {load} |"
        )
    for p in DTYPES:
        print(
            f"| matmul {args.matmul_size}^3 | | {p} | | {peak[p]:.1f} | 100% | "
            f"{100 * peak[p] / peak['bf16']:.0f}% | |"
        )
    print("other load: share of the machine's CPU used by other processes during the timed steps")


if __name__ == "__main__":
    main()
