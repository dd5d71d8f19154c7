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

``--vs-reference`` instead times ledgerlm's step against a minimal nanoGPT-style model of
the same size written here (``MinimalGPT``: learned positions, pre-norm LayerNorm blocks,
one qkv matmul, ``scaled_dot_product_attention(is_causal=True)``, a GELU MLP, tied head,
mean cross-entropy over every position, fused AdamW), on the same batches, in the same
process, interleaved: repeats alternate which side runs first, and each repeat's ratio is
its best ledgerlm step against its best reference step. Its non-embedding parameters
match ledgerlm's exactly (the GELU MLP is 1.5x as wide as SwiGLU, so its two matrices
hold what SwiGLU's three do); it adds nanoGPT's learned position table::

    python bench/train_step.py --vs-reference                    # eager and compiled, fp32
    python bench/train_step.py --vs-reference --cold --profile    # cold compiles; where time goes
    python bench/train_step.py --vs-reference --attention cross

``--cold`` points inductor at an empty cache, so the first compiled step (reported apart)
is a cold compile; ``--profile`` then sums each side's profiled self CPU time by what it
does (matmuls, attention, loss, optimizer, fused compiled kernels, the rest).
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
import torch.nn as nn
import torch.nn.functional as F

from ledgerlm.config import ModelConfig, TrainConfig, load_recipe
from ledgerlm.model.gpt import GPT, ffn_hidden
from ledgerlm.tokens.packing import Batch, batches, pack_documents
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from machine_load import cpu_jiffies, foreign_load, own_cpu

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
    torch._dynamo.reset()
    trainer = _trainer(shape, mode, precision, synthetic_batches(shape, 4))
    model = trainer.model
    warm = sum(_timed(trainer.train_step) for _ in range(args.warmup))
    load, own = cpu_jiffies(), own_cpu()
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


class MinimalBlock(nn.Module):
    """nanoGPT's block: ``x = x + attn(ln(x)); x = x + mlp(ln(x))``."""

    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, bias=False)
        self.c_attn = nn.Linear(d, 3 * d, bias=False)
        self.c_proj = nn.Linear(d, d, bias=False)
        self.ln_2 = nn.LayerNorm(d, bias=False)
        self.c_fc = nn.Linear(d, hidden, bias=False)
        self.mlp_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class MinimalGPT(nn.Module):
    """A minimal nanoGPT-style decoder with ledgerlm's non-embedding parameter count."""

    def __init__(self, cfg: ModelConfig, vocab: int, seq_len: int) -> None:
        super().__init__()
        d = cfg.d_model
        hidden = 3 * ffn_hidden(cfg) // 2  # 2 x d x hidden = SwiGLU's 3 x d x ffn_hidden
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.h = nn.ModuleList(MinimalBlock(d, cfg.n_heads, hidden) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, cfg.init_std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of every position, computed inside the model as nanoGPT
        does (so a compiled model compiles it too)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def _adamw_kind() -> dict:
    """``fused=True`` where this torch has a CPU fused AdamW, else ``foreach``."""
    try:
        torch.optim.AdamW([nn.Parameter(torch.zeros(1))], fused=True)
        return {"fused": True}
    except (RuntimeError, TypeError):
        return {"foreach": True}


def reference_step(shape: Shape, mode: str, data: list[Batch], cfg: TrainConfig):
    """A nanoGPT training step on ``data`` (cycled): forward with the mean cross-entropy
    over every position, backward, clipping, fused AdamW. Returns (step function, model)."""
    from torch.profiler import record_function

    model = MinimalGPT(shape.model, shape.vocab, shape.seq_len)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **_adamw_kind())
    if mode == "compiled":
        model.compile(dynamic=False)
    batches_ = itertools.cycle(data)

    def step() -> None:
        b = next(batches_)
        with record_function("trainer.forward"):
            loss = model(b.input_ids, b.targets)
        opt.zero_grad(set_to_none=True)
        with record_function("trainer.backward"):
            loss.backward()
        with record_function("trainer.clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()

    return step, model


def _trainer(shape: Shape, mode: str, precision: str, data: list[Batch]) -> Trainer:
    torch.manual_seed(0)
    model = GPT(shape.model, shape.vocab)
    cfg = TrainConfig(
        max_steps=10**6,
        micro_batch_rows=shape.rows,
        warmup_steps=0,
        precision=precision,
        compile=mode == "compiled",
    )
    return Trainer(model, build_optimizer(model, cfg), cfg, itertools.cycle(data), shape.attention)


# Where a step's time goes: each profiled op's own time, by what it is doing.
LOSS_GRADS = {
    "LogSoftmaxBackward0",
    "NllLossBackward0",
    "IndexBackward0",
    "MaskedScatterBackward0",
    "_ChunkedHeadLossBackward",
}


def _category(event) -> str:
    name, parents = event.name, []
    node = event.cpu_parent
    while node is not None:
        parents.append(node.name)
        node = node.cpu_parent
    grads = {p.split(": ", 1)[-1] for p in parents if p.startswith("autograd::engine")}
    if any(p.startswith("Optimizer.") for p in parents):
        return "optimizer (zero_grad, step)"
    if "trainer.clip" in parents:
        return "clip (grad norm)"
    if "trainer.mask" in parents:
        return "attention mask"
    if name in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "matmul (fwd + bwd)"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention (fwd + bwd)"
    loss_op = any(key in name for key in ("log_softmax", "nll_loss", "cross_entropy"))
    chunked = "_ChunkedHeadLoss" in parents  # ledgerlm's head scored in chunks
    if "trainer.loss" in parents or grads & LOSS_GRADS or loss_op or chunked:
        return "loss (softmax, NLL, selection; fwd + bwd; not the head matmul)"
    if "Compiled" in name or "CompiledFxGraph" in name or "Torch-Compiled" in name:
        return "compiled fused kernels"
    return "other (norms, RoPE/positions, MLP activation, residuals, embedding, host)"


def profile_summary(step, steps: int = 3) -> tuple[dict[str, float], float]:
    """(ms per step by category of self CPU time, wall ms per step) over ``steps`` steps."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - start) / steps * 1e3
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name != "CPU":
            continue
        key = _category(event)
        totals[key] = totals.get(key, 0.0) + event.self_cpu_time_total / 1e3 / steps
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])), wall


def compare(shape: Shape, mode: str, args: argparse.Namespace) -> dict:
    """ledgerlm against ``MinimalGPT`` on the same batches, interleaved (see the module doc)."""
    torch._dynamo.reset()
    data = synthetic_batches(shape, 4)
    trainer = _trainer(shape, mode, "fp32", data)
    ref, ref_model = reference_step(shape, mode, data, trainer.cfg)
    sides = {"ledgerlm": trainer.train_step, "reference": ref}
    first = {name: _timed(fn) for name, fn in sides.items()}  # compiles, when compiled
    for _ in range(args.warmup):
        for fn in sides.values():
            fn()
    tokens = shape.rows * shape.seq_len
    best: dict[str, list[float]] = {name: [] for name in sides}
    load, own = cpu_jiffies(), own_cpu()
    for r in range(args.repeats):
        for name in sides if r % 2 == 0 else reversed(list(sides)):
            best[name].append(min(_timed(sides[name]) for _ in range(args.steps)))
    foreign = foreign_load(load, own)
    ratios = sorted(b / a for a, b in zip(best["ledgerlm"], best["reference"], strict=True))
    out = {
        "mode": mode,
        "attention": shape.attention,
        "first_s": first,
        "tokens_per_s": {n: tokens / float(np.median(t)) for n, t in best.items()},
        "ratios": ratios,
        "foreign": foreign,
        "params": {
            "ledgerlm": trainer.model.num_params(non_embedding=True),
            "reference": sum(p.numel() for p in ref_model.parameters())
            - ref_model.wte.weight.numel()
            - ref_model.wpe.weight.numel(),
        },
    }
    if args.profile:
        out["profile"] = {n: profile_summary(fn) for n, fn in sides.items()}
    return out


def vs_reference(args: argparse.Namespace) -> None:
    shape = shapes(args)["demo"]
    print(
        f"{shape.name}: {shape.rows} rows x {shape.seq_len} tokens, vocabulary {shape.vocab}, "
        f"{shape.attention} attention (the reference: causal), fp32; "
        f"{args.repeats} repeats x best of {args.steps} steps; inductor cache "
        + ("empty (cold compiles)" if args.cold else "as found")
    )
    results = []
    for mode in args.modes:
        r = compare(shape, mode, args)
        results.append(r)
        print(
            f"  {mode}: non-embedding params ledgerlm {r['params']['ledgerlm']:,}, reference "
            f"{r['params']['reference']:,}; first step (compile when compiled): ledgerlm "
            f"{r['first_s']['ledgerlm']:.1f} s, reference {r['first_s']['reference']:.1f} s",
            flush=True,
        )
    print()
    print(
        "| mode | ledgerlm tokens/s | reference tokens/s | ratio min | median | max "
        "| first step s (ledgerlm / ref) | other load |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratios, tps = r["ratios"], r["tokens_per_s"]
        load = "?" if r["foreign"] is None else f"{100 * r['foreign']:.0f}%"
        print(
            f"| {r['mode']} | {tps['ledgerlm']:,.0f} | {tps['reference']:,.0f} | "
            f"{ratios[0]:.2f} | {float(np.median(ratios)):.2f} | {ratios[-1]:.2f} | "
            f"{r['first_s']['ledgerlm']:.1f} / {r['first_s']['reference']:.1f} | {load} |"
        )
    print("ratio: ledgerlm tokens/s over the reference's, per repeat (best step of each)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for r in results:
        for name, (cats, wall) in r.get("profile", {}).items():
            print(f"\n--- where a step goes: {name}, {r['mode']} (ms per step, self CPU time)")
            print(f"  wall {wall:.1f} ms")
            for key, ms in cats.items():
                print(f"  {ms:8.1f}  {100 * ms / sum(cats.values()):4.0f}%  {key}")


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
    parser.add_argument(
        "--vs-reference", action="store_true", help="time the demo model against MinimalGPT"
    )
    parser.add_argument("--repeats", type=int, default=5, help="--vs-reference: repeats")
    parser.add_argument(
        "--cold", action="store_true", help="an empty inductor cache: first steps compile cold"
    )
    args = parser.parse_args()
    if args.cold:
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    print(
        f"torch {torch.__version__}, {threads} threads, "
        f"cpu: {torch.backends.cpu.get_cpu_capability()}, load average {os.getloadavg()[0]:.2f}"
    )
    if args.vs_reference:
        vs_reference(args)
        return
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
