"""Time-to-target race: ledgerlm's race recipe against a minimal character-level trainer,
on the same ~1 MB of English prose and the same held-out tail, to the same target in
bits per character, wall time end to end (start-up and data preparation included).

The corpus is made from files every Python install has (``examples/python_docs_text.py``:
the language reference and the standard library's docstrings), kept to ASCII so bytes
and characters coincide, and cut at a paragraph: the last 10% is the validation text of
both sides, the rest their training text.

- **Baseline** (in this file, run as a subprocess): a minimal GPT over characters with
  the published CPU settings of the well-known character-level example: 4 layers, 4
  heads, 128 wide, context 64, batch 12, AdamW at 1e-3 (beta2 0.99, weight decay 0.1,
  100 warmup steps, cosine to 1e-4 over 2000 iterations), clipping at 1, no dropout;
  every 250 iterations it estimates the validation loss on 20 random batches of the
  held-out text, and it stops at the first estimate at or below the target.
- **ledgerlm**: ``ledgerlm run configs/race.toml`` with the training text as its source
  and a sample of the held-out text spread evenly over it (every k-th paragraph, about
  16,000 characters, the size of the baseline's estimate) as ``eval.sources``, its
  fixed validation set, stopping at the confirmed target
  (``eval.target_bpb``): data preparation, tokenizer training, training, evaluation
  and the final checkpoint all on the bill.

Each side is timed as a whole command (a fresh process, the way a user waits for it);
the ledger's own time-to-target and its phases are printed beside it. Sides alternate
over the repeats (seeds 0, 1, ...), and the ratio is baseline / ledgerlm per repeat,
reported as min / median / max; where the baseline ends its iterations short of the
target, the ratio is reported apart as a lower bound (``ratio_at_least``).

    python bench/race.py                      # 3 repeats, about 6 minutes on 2 cores
    python bench/race.py --target 3.2         # a target the baseline reaches
    python bench/race.py --ablate --repeat 2      # ledgerlm alone: the recipe's ablations
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import cpu_jiffies, foreign_load, own_cpu

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "race.toml"
# 2.0 nats per character, in bits per character (= per byte: the corpus is ASCII). On this
# corpus the baseline's 2,000 iterations end short of it (~3.0-3.1 bits per character):
# its whole run is then a lower bound of its time, and so is the ratio. ``--target 3.2``
# is a target both sides reach.
TARGET_BITS = round(2.0 / math.log(2), 3)
# Characters of held-out text ledgerlm evaluates on: the baseline's estimate reads 20
# batches x 12 rows x 64 characters = 15,360
SAMPLE_CHARS = 16_000

BASELINE = r"""
import math, sys, time, json
import torch, torch.nn as nn, torch.nn.functional as F
train_path, val_path = sys.argv[1], sys.argv[2]
target_bits, seed = float(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(seed)
train, val = open(train_path).read(), open(val_path).read()
chars = sorted(set(train + val))
idx = {c: i for i, c in enumerate(chars)}
tr = torch.tensor([idx[c] for c in train], dtype=torch.long)
va = torch.tensor([idx[c] for c in val], dtype=torch.long)
V, T, B, L, H, D = len(chars), 64, 12, 4, 4, 128
ITERS, EVAL_EVERY, EVAL_ITERS, LR, MIN_LR, WARMUP = 2000, 250, 20, 1e-3, 1e-4, 100

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)
        self.head.weight = self.tok.weight
    def forward(self, x, y):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for blk in self.blocks:
            h = blk(h)
        return F.cross_entropy(self.head(self.ln(h)).view(-1, V), y.view(-1))

def batch(data):
    i = torch.randint(len(data) - T - 1, (B,))
    return torch.stack([data[j:j + T] for j in i]), torch.stack([data[j + 1:j + T + 1] for j in i])

model = GPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
rest = [p for p in model.parameters() if p.dim() < 2]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.99))

def lr_at(it):
    if it < WARMUP:
        return LR * (it + 1) / WARMUP
    r = (it - WARMUP) / (ITERS - WARMUP)
    return MIN_LR + 0.5 * (1 + math.cos(math.pi * min(r, 1.0))) * (LR - MIN_LR)

evals = []
for it in range(ITERS + 1):
    if it % EVAL_EVERY == 0 or it == ITERS:
        model.eval()
        with torch.no_grad():
            loss = sum(model(*batch(va)).item() for _ in range(EVAL_ITERS)) / EVAL_ITERS
        model.train()
        evals.append({"iter": it, "nats_per_char": loss, "bits_per_char": loss / math.log(2)})
        if loss / math.log(2) <= target_bits:
            break
    if it == ITERS:
        break
    for g in opt.param_groups:
        g["lr"] = lr_at(it)
    loss = model(*batch(tr))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print(json.dumps({"reached": evals[-1]["bits_per_char"] <= target_bits, "evals": evals}))
"""


def make_corpus(folder: Path) -> tuple[Path, Path, dict]:
    """train.txt and val.txt: ~1 MB of ASCII prose, the last 10% (cut at a paragraph)
    held out."""
    raw = folder / "python-docs.txt"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python_docs_text.py"), str(raw)],
        check=True,
        capture_output=True,
    )
    text = raw.read_text(encoding="utf-8").encode("ascii", "ignore").decode("ascii")
    cut = text.rfind("\n\n", 0, int(len(text) * 0.9)) + 2
    train, val = folder / "train.txt", folder / "val.txt"
    train.write_text(text[:cut], encoding="ascii")
    val.write_text(text[cut:], encoding="ascii")
    # ledgerlm's validation set: every k-th paragraph of the tail, ~SAMPLE_CHARS in all
    # (a sized set spread evenly over the tail, like the baseline's random windows)
    paragraphs = [p for p in text[cut:].split("\n\n") if p.strip()]
    k = max(1, round((len(text) - cut) / SAMPLE_CHARS))
    sample = "\n\n".join(paragraphs[k // 2 :: k]) + "\n"
    (folder / "val-sample.txt").write_text(sample, encoding="ascii")
    return (
        train,
        val,
        {
            "chars": len(text),
            "train_chars": cut,
            "val_chars": len(text) - cut,
            "val_paragraphs": len(paragraphs),
            "sample_every": k,
            "sample_chars": len(sample),
        },
    )


def run_baseline(folder: Path, train: Path, val: Path, target: float, seed: int) -> dict:
    script = folder / "baseline.py"
    script.write_text(BASELINE)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), str(train), str(val), str(target), str(seed)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    last = out["evals"][-1]
    return {
        "wall_s": wall,
        "reached": out["reached"],
        "at": f"iter {last['iter']}",
        "bits_per_char": last["bits_per_char"],
    }


def run_ledgerlm(
    folder: Path, train: Path, val: Path, target: float, seed: int, extra: list[str]
) -> dict:
    ws = folder / f"ws-{seed}-{time.monotonic_ns()}"
    exe = Path(sys.executable).with_name("ledgerlm")
    sets = [
        f'data.sources=[{{path = "{train}", split = "blank_lines", domain = "docs"}}]',
        f'eval.sources=[{{path = "{folder / "val-sample.txt"}", split = "blank_lines", '
        'domain = "docs"}]',
        f"eval.target_bpb={target}",
        f"train.seed={seed}",
        *(x.format(val=val) for x in extra),
    ]
    args = [str(exe), "run", str(RECIPE), "-w", str(ws)]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "LEDGERLM_PROGRESS_SECONDS": "0"}
    start = time.perf_counter()
    subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - start
    shown = subprocess.run(
        [str(exe), "ledger", "show", "latest", "-w", str(ws), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    summary = json.loads(shown.stdout)
    ttt = summary.get("time_to_target") or {}
    phases: dict[str, float] = {}
    for p in summary["phases"]:
        phases[p["kind"]] = phases.get(p["kind"], 0.0) + (p.get("seconds") or 0.0)
    last = summary["evaluations"][-1]
    by_phase = dict(ttt.get("by_phase") or {})
    upkeep = by_phase.get("eval", 0.0) + by_phase.get("checkpoint", 0.0)
    return {
        "wall_s": wall,
        "reached": summary["run"]["status"] == "reached",
        "at": f"step {last['step']}",
        "step": last["step"],
        "bits_per_char": last["metrics"].get("nats_per_char", math.nan) / math.log(2),
        "ledger_ttt_s": ttt.get("seconds"),
        "ttt_by_phase_s": by_phase,
        # evaluation and checkpoints as a share of the ledger's time-to-target
        "eval_checkpoint_share": upkeep / ttt["seconds"] if ttt.get("seconds") else None,
        "phases_s": phases,
    }


# The ablations behind configs/race.toml: each changes one choice of the recipe.
ABLATIONS: dict[str, list[str]] = {
    "recipe": [],
    "vocab 2048": ["tokenizer.vocab_size=2048"],
    "vocab 8192": ["tokenizer.vocab_size=8192"],
    "context 32": ["pack.seq_len=32"],
    "context 128": ["pack.seq_len=128"],
    "batch 4 rows": ["train.micro_batch_rows=4"],
    "batch 16 rows": ["train.micro_batch_rows=16"],
    "lr 1.5e-3": ["train.lr=1.5e-3"],
    "lr 6e-3": ["train.lr=6e-3"],
    "warmup 20": ["train.warmup_steps=20"],
    "cosine over 300": ["train.schedule=cosine", "train.max_steps=300"],
    "eval every 15": ["eval.every_steps=15"],
    "eval every 60": ["eval.every_steps=60"],
    "eval on the whole tail": [
        'eval.sources=[{{path = "{val}", split = "blank_lines", domain = "docs"}}]',
        "eval.max_tokens=65536",
    ],
    "async eval": ["eval.asynchronous=true"],
    "near dedup on": ["data.near_dedup.enabled=true"],
}


def ablate(folder: Path, train: Path, val: Path, args: argparse.Namespace) -> list[dict]:
    """ledgerlm alone, each ablation ``args.repeat`` times (seeds 0, 1, ...), in turn."""
    chosen = args.only or list(ABLATIONS)
    rows = []
    for seed in range(args.repeat):
        for name in chosen:
            load_start, own = cpu_jiffies(), own_cpu()
            extra = [*ABLATIONS[name], *args.extra]
            out = run_ledgerlm(folder, train, val, args.target, seed, extra)
            out.update(variant=name, seed=seed, other_load=foreign_load(load_start, own))
            rows.append(out)
            if not args.json:
                print(
                    f"{name} (seed {seed}): {out['wall_s']:.1f} s, {out['at']}, "
                    f"{out['bits_per_char']:.3f} bit/char, reached {out['reached']}, ledger "
                    f"time-to-target {out['ledger_ttt_s']}, eval+checkpoint share "
                    f"{out['eval_checkpoint_share']}, other load {out['other_load']}",
                    flush=True,
                )
    return rows


def ablation_table(rows: list[dict]) -> list[dict]:
    """Per ablation: the median whole-command seconds (a run that missed the target
    counts as infinite), steps, and its ratio to the recipe's median."""
    table = []
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        walls = [r["wall_s"] if r["reached"] else math.inf for r in mine]
        shares = [r["eval_checkpoint_share"] for r in mine if r["eval_checkpoint_share"]]
        table.append(
            {
                "variant": name,
                "median_s": statistics.median(walls),
                "steps": [r["step"] for r in mine],
                "reached": sum(r["reached"] for r in mine),
                "runs": len(mine),
                "eval_checkpoint_share": statistics.median(shares) if shares else None,
            }
        )
    base = next((t["median_s"] for t in table if t["variant"] == "recipe"), None)
    for t in table:
        t["vs_recipe"] = t["median_s"] / base if base and math.isfinite(base) else None
    return table


def _spread(values: list[float]) -> dict[str, float | None]:
    return {
        "min": min(values) if values else None,
        "median": statistics.median(values) if values else None,
        "max": max(values) if values else None,
        "n": len(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", type=float, default=TARGET_BITS, help="bits per character")
    parser.add_argument(
        "--set", dest="extra", action="append", default=[], help="extra ledgerlm --set"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--ablate", action="store_true", help="ledgerlm alone: the recipe and its ablations"
    )
    parser.add_argument(
        "--only", action="append", choices=list(ABLATIONS), help="--ablate: these ablations"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        train, val, sizes = make_corpus(folder)
        if args.ablate:
            rows = ablate(folder, train, val, args)
            table = ablation_table(rows)
            if args.json:
                print(json.dumps({"corpus": sizes, "rows": rows, "table": table}, indent=2))
                return
            for t in table:
                ratio = f"{t['vs_recipe']:.2f}x" if t["vs_recipe"] else "-"
                share = t["eval_checkpoint_share"]
                print(
                    f"{t['variant']:<16} {t['median_s']:7.1f} s  {ratio:>6} of the recipe  "
                    f"steps {t['steps']}  reached {t['reached']}/{t['runs']}  eval+checkpoint "
                    f"{'-' if share is None else f'{share:.1%}'}"
                )
            return
        rows = []
        for seed in range(args.repeat):
            load_start, own = cpu_jiffies(), own_cpu()
            sides = [
                ("baseline", lambda s=seed: run_baseline(folder, train, val, args.target, s)),
                (
                    "ledgerlm",
                    lambda s=seed: run_ledgerlm(folder, train, val, args.target, s, args.extra),
                ),
            ]
            if seed % 2:  # alternate which side runs first
                sides.reverse()
            row = {"seed": seed}
            for name, fn in sides:
                row[name] = fn()
            row["ratio"] = row["baseline"]["wall_s"] / row["ledgerlm"]["wall_s"]
            row["other_load"] = foreign_load(load_start, own)
            rows.append(row)
            if not args.json:
                b, m = row["baseline"], row["ledgerlm"]
                print(
                    f"seed {seed}: baseline {b['wall_s']:.1f} s ({b['at']}, "
                    f"{b['bits_per_char']:.3f} bit/char, reached {b['reached']}); ledgerlm "
                    f"{m['wall_s']:.1f} s ({m['at']}, {m['bits_per_char']:.3f} bit/char, "
                    f"ledger time-to-target {m['ledger_ttt_s']}, reached {m['reached']}); "
                    f"x{row['ratio']:.2f}; other load {row['other_load']}",
                    flush=True,
                )
    both = [r["ratio"] for r in rows if r["baseline"]["reached"] and r["ledgerlm"]["reached"]]
    # the baseline ran out of iterations short of the target: its whole run is a lower
    # bound of its time to the target, so the ratio is one too
    bounds = [r["ratio"] for r in rows if r["ledgerlm"]["reached"] and not r["baseline"]["reached"]]
    result = {
        "corpus": sizes,
        "target_bits_per_char": args.target,
        "rows": rows,
        "ratio": _spread(both),
        "ratio_at_least": _spread(bounds),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(json.dumps({"ratio": result["ratio"], "ratio_at_least": result["ratio_at_least"]}))


if __name__ == "__main__":
    main()
