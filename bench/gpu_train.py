"""GPU training throughput and model FLOPs utilisation (MFU) of ledgerlm's trainer.

Trains a GPT-2-small-shaped decoder (d_model 768, 12 layers, 12 heads, seq_len 1024,
vocab 50,304) as ``ledgerlm run`` trains one on a GPU: deterministic kernels, the seed
and threads of ``lab.build.determinism``, the model built on the meta device and
materialised by ``train.parallelize`` with the recipe's activation checkpointing and
per-block ``torch.compile``, the library's ``Trainer`` with bf16 autocast, each update
made as ``fit`` makes it (``Trainer.update``), on packed rows of random documents (isolated
attention: flex_attention with a document block mask on CUDA). Each timed step ends
with ``torch.cuda.synchronize()``, so a step's time is the device's, not the host's.

    MFU = tokens/s x FLOPs per token / the device's dense bf16 peak
    FLOPs per token = 6 N + 12 L d T          (torchtitan's and nanoGPT's convention)
    causal variant  = 6 N + 6 L d T           (only the lower triangle of the scores)

N counts every weight the forward multiplies by (blocks, final norm, the head, the
embedding matrix once more when tied: it is the head's matmul); 12 L d T is the
attention's score and value matmuls, forward and backward, over the full T x T score
matrix. Both MFUs are reported, the first as the headline (comparable with the peers'
figures). The peak is looked up by the device's name, the longest table name the
device's name contains winning ("H200 NVL" before "H200", "GH200" before "H200", "L40"
before "L4"); ``--peak-tflops`` overrides it. The timed steps follow untimed warm-up
steps (compilation); the figure is the median.

    python bench/gpu_train.py                       # on a CUDA machine
    python bench/gpu_train.py --rows 8 --steps 30 --json
    python bench/gpu_train.py --device cpu --d-model 64 --layers 2 --heads 2 \\
        --seq-len 128 --vocab 512 --rows 4 --steps 3 --warmup 1 --no-compile  # a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import numpy as np
import torch

from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.lab.build import determinism
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import Batch, batches, pack_documents
from ledgerlm.train.distributed import World
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.parallelize import parallelize

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from NVIDIA's data sheets.
# The longest name contained in torch.cuda.get_device_name() wins (``peak_tflops``).
PEAKS_TFLOPS = {
    "H100": 989.0,  # SXM
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.0,  # SXM
    "H200 NVL": 835.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
}


def peak_tflops(name: str) -> float | None:
    """The peak of the longest table name that ``name`` contains (None if none does)."""
    found = [key for key in PEAKS_TFLOPS if key in name]
    return PEAKS_TFLOPS[max(found, key=len)] if found else None


def flops_per_token(model: GPT, seq_len: int, causal: bool = False) -> tuple[int, float]:
    """(N, FLOPs per trained token), as the module doc defines them; ``causal`` counts
    only the lower triangle of the attention scores."""
    cfg = model.cfg
    n = model.num_params(non_embedding=True)
    if cfg.tie_embeddings:
        n += model.embed.weight.numel()
    attention = (6 if causal else 12) * cfg.n_layers * cfg.d_model * seq_len
    return n, 6 * n + attention


def packed(rows: int, seq_len: int, vocab: int, count: int, seed: int = 0) -> list[Batch]:
    """Rows packed from random documents of 30 to 2,000 tokens, as training packs them."""
    rng = np.random.default_rng(seed)

    def docs():
        while True:
            yield rng.integers(3, vocab, size=int(rng.integers(30, 2000))), 0

    stream = pack_documents(docs(), seq_len + 1, 1, 2, 0, pad_last=False)
    return list(itertools.islice(batches(stream, rows), count))


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50_304)
    ap.add_argument("--rows", type=int, default=16, help="rows per optimizer step")
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation)")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--peak-tflops", type=float, help="the device's dense peak, TFLOP/s")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def measure(args: argparse.Namespace) -> dict:
    """Train ``args.warmup + args.steps`` updates as a run would; the figures as a dict."""
    train = TrainConfig(
        max_steps=10**9,
        micro_batch_rows=args.rows,
        warmup_steps=0,
        precision=args.precision,
        compile=not args.no_compile,
        activation_checkpointing=args.activation_checkpointing,
        device=args.device,
    )
    determinism(train)  # what every run does first: seed, threads, deterministic kernels
    world = World().placed(args.device, "none")
    cfg = ModelConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads)
    model = GPT(cfg, args.vocab, device="meta")
    engine = parallelize(model, world, train)  # checkpointing, compile, materialised
    data = itertools.cycle(packed(args.rows, args.seq_len, args.vocab, 4))
    optimizer = build_optimizer(model, train)
    trainer = Trainer(model, optimizer, train, data, "isolated", world=world, engine=engine)
    cuda = world.device.type == "cuda"

    def step() -> float:
        start = time.perf_counter()
        trainer.update()  # as fit runs it: the loss is read by the next update
        if cuda:
            torch.cuda.synchronize(world.device)  # the device has finished the step
        return time.perf_counter() - start

    warm = sum(step() for _ in range(args.warmup))
    if cuda:
        torch.cuda.reset_peak_memory_stats(world.device)
    times = [step() for _ in range(args.steps)]
    trainer.settle()
    losses = [r.loss for r in trainer.state.history]
    assert all(x == x for x in losses), "a loss is NaN"
    n, per_token = flops_per_token(model, args.seq_len)
    _, per_token_causal = flops_per_token(model, args.seq_len, causal=True)
    tokens_per_s = args.rows * args.seq_len / statistics.median(times)
    name = torch.cuda.get_device_name(world.device) if cuda else "cpu"
    peak = args.peak_tflops or peak_tflops(name)
    achieved = per_token * tokens_per_s / 1e12
    achieved_causal = per_token_causal * tokens_per_s / 1e12
    return {
        "device": name,
        "peak_tflops": peak,
        "peak_source": "--peak-tflops" if args.peak_tflops else "NVIDIA data sheet (dense bf16)",
        "params_N": n,
        "flops_per_token": per_token,
        "flops_per_token_causal": per_token_causal,
        "shape": vars(args),
        "warmup_s": warm,
        "step_s_median": statistics.median(times),
        "tokens_per_s": tokens_per_s,
        "tflops": achieved,
        "mfu": achieved / peak if peak else None,
        "mfu_causal": achieved_causal / peak if peak else None,
        "attention": trainer.model.attention_spec(
            torch.zeros(1, 8, dtype=torch.long, device=world.device), "isolated"
        ).kind,
        "peak_memory_gb": torch.cuda.max_memory_allocated(world.device) / 2**30 if cuda else None,
    }


def main() -> int:
    args = arguments()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_train: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    out = measure(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    name, peak = out["device"], out["peak_tflops"]
    print(
        f"{name}: N = {out['params_N'] / 1e6:.1f}M, {out['flops_per_token'] / 1e6:.0f} "
        f"MFLOP/token, attention {out['attention']}, {args.precision}, "
        f"compile {'off' if args.no_compile else 'on'}"
    )
    print(
        f"{out['tokens_per_s']:,.0f} tokens/s (median of {args.steps} steps after "
        f"{args.warmup} warm-up steps, {out['warmup_s']:.1f} s), {out['tflops']:.1f} TFLOP/s"
    )
    if peak:
        print(
            f"MFU {100 * out['mfu']:.1f}% of {peak:g} TFLOP/s ({out['peak_source']}); "
            f"{100 * out['mfu_causal']:.1f}% counting causal attention FLOPs only"
        )
    else:
        print(f"MFU: no peak known for {name!r}; pass --peak-tflops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
