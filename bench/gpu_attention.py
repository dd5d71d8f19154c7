"""GPU attention backends: masked SDPA against flex_attention on the demo model.

On a CUDA machine, times forward + backward of the demo recipe's model on synthetic
packed rows (isolated attention) with each backend: ``sdpa`` (the explicit
(B, 1, T, T) mask), ``flex`` (flex_attention with a document block mask) and, for
reference, ``causal`` (what ``cross`` runs: SDPA ``is_causal``). Building the mask
is part of every step. Prints tokens/s, the ratio to sdpa and peak memory, then
checks that flex's logits for a packed row equal each document run alone.
On CPU it exits with a message.

    python bench/gpu_attention.py [--seq-len 2048] [--rows 16] [--steps 20] [--bf16]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ledgerlm.config import load_recipe
from ledgerlm.model.attention import attention_spec
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import Batch, batches, pack_documents

ROOT = Path(__file__).resolve().parents[1]
SETUPS = {"sdpa": ("isolated", "sdpa"), "flex": ("isolated", "flex"), "causal": ("cross", "auto")}


def packed_batches(n: int, rows: int, seq_len: int, vocab: int, seed: int = 0) -> list[Batch]:
    """Rows of random documents (mean length ~ seq_len / 4), packed as training packs them."""
    rng = np.random.default_rng(seed)
    sizes = (int(rng.exponential(seq_len / 4)) + 1 for _ in itertools.count())
    docs = ((rng.integers(3, vocab, size=n), 0) for n in sizes)
    stream = pack_documents(docs, seq_len + 1, 1, 2, 0, pad_last=False)
    return [next(batches((next(stream) for _ in range(rows)), rows)) for _ in range(n)]


def step(model: GPT, b: Batch, backend: str, bf16: bool) -> None:
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        spec = attention_spec(b.doc_ids, *SETUPS[backend])  # once per batch, as training does
        logits = model(b.input_ids, b.position_ids, spec)
        loss = F.cross_entropy(logits[b.loss_mask].float(), b.targets[b.loss_mask])
    loss.backward()


def to_cuda(b: Batch) -> Batch:
    return Batch(**{k: v.cuda(non_blocking=True) for k, v in vars(b).items()})


def main() -> int:
    demo = load_recipe(ROOT / "configs" / "demo.toml")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=demo.pack.seq_len)
    ap.add_argument("--rows", type=int, default=demo.train.micro_batch_rows)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (default fp32)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to compare (on CPU, training always uses masked SDPA)")
        return 0
    vocab, tokens = demo.tokenizer.vocab_size, args.rows * args.seq_len
    torch.manual_seed(0)
    model = GPT(demo.model, vocab).cuda()
    data = [to_cuda(b) for b in packed_batches(args.steps, args.rows, args.seq_len, vocab)]
    print(
        f"{torch.cuda.get_device_name()}: demo model ({model.num_params():,} parameters), "
        f"{args.rows} x {args.seq_len} tokens, {'bf16' if args.bf16 else 'fp32'}, "
        f"torch {torch.__version__}"
    )
    rates = {}
    for backend in ("sdpa", "flex", "causal"):
        for b in data[:3]:  # warm up: kernel selection and flex's compilation
            step(model, b, backend, args.bf16)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for b in data:
            step(model, b, backend, args.bf16)
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        rate = rates[backend] = tokens * len(data) / (time.perf_counter() - start)
        print(
            f"  {backend:<7} {rate:>12,.0f} tokens/s  x{rate / rates['sdpa']:.2f} vs sdpa"
            f"  peak {torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB"
        )

    # flex: a packed row's logits equal each of its documents run alone (masked SDPA)
    model.eval()
    b, worst = data[0], 0.0
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=args.bf16):
        spec = attention_spec(b.doc_ids, "isolated", "flex")
        packed = model(b.input_ids, b.position_ids, spec)[0]
        doc_ids = b.doc_ids[0]
        for seg in torch.unique_consecutive(doc_ids).tolist():
            at = (doc_ids == seg).nonzero()[:, 0]
            one = attention_spec(doc_ids[at][None], "isolated", "sdpa")
            alone = model(b.input_ids[:, at], b.position_ids[:, at], one)[0]
            worst = max(worst, (packed[at] - alone).abs().max().item())
    tol = 5e-2 if args.bf16 else 1e-4
    ok = worst <= tol
    print(
        f"packed row == documents alone (flex): max |diff| {worst:.2e} ({'ok' if ok else 'FAIL'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
