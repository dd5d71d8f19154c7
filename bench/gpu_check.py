"""One prepared check of the GPU training path, for the few minutes a GPU is lent.

Each section runs on its own (one failing does not stop the others) and reports to one
JSON file (``--out``), also printed as one line per section:

- ``cuda_tests``: the test suite's CUDA tests (those that skip without a GPU).
- ``trainer``: the library's Trainer on the device, bf16 autocast, eager and compiled, at
  a sequence length that is not a multiple of 128, under the deterministic kernels every
  run uses: finite losses, no determinism error.
- ``resume``: k updates, a checkpoint, k more in a fresh model and optimizer, against
  2k uninterrupted updates: the weights must be bitwise equal.
- ``head_loss``: the chunked head loss against fp32 ``cross_entropy`` over whole logits
  at vocabulary 50,304: relative error of the loss and of both gradients.
- ``recompiles``: compiled training steps over batches of varied document layouts, and a
  short last batch: how many graphs torch.compile made.
- ``mask_build``: the flex document block mask built eagerly and compiled, T = 1,024
  and 4,096: milliseconds per build.
- ``fsdp``: one FSDP2 rank (gloo on CPU, NCCL on CUDA) with the bf16 policy on CUDA:
  the dtype of the loss weights inside the model, an evaluation between two updates
  (the next update must equal one without it), a sharded checkpoint round trip.
- ``host_idle``: the share of wall time between steps when the device runs no kernel
  (from a profile of several steps).
- ``throughput``: tokens/s and MFU of GPT-2 small (``bench/gpu_train.py``).
- ``eval_memory``: peak memory of one evaluation batch at vocabulary 50,304.

    python bench/gpu_check.py                          # on a CUDA machine, < 8 minutes
    python bench/gpu_check.py --device cpu --tiny      # what a CPU can run, < 2 minutes
    python bench/gpu_check.py --only resume head_loss  # some sections
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_train
from ledgerlm.config import ModelConfig, TrainConfig
from ledgerlm.lab.build import determinism
from ledgerlm.model.gpt import GPT
from ledgerlm.model.head_loss import head_loss
from ledgerlm.train.checkpoint import load_checkpoint, save_checkpoint
from ledgerlm.train.distributed import World
from ledgerlm.train.evaluate import evaluate
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.train.parallelize import parallelize

ROOT = Path(__file__).resolve().parents[1]


class Skip(Exception):
    """A section that cannot run on this device; its message says why."""


class Check:
    """The device and the shapes every section uses (full size, or ``--tiny``)."""

    def __init__(self, device: str, tiny: bool) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.tiny = tiny
        if tiny:
            self.model = ModelConfig(d_model=64, n_layers=2, n_heads=2)
            self.vocab, self.seq_len, self.rows = 512, 100, 4
        else:
            self.model = ModelConfig(d_model=768, n_layers=12, n_heads=12)
            self.vocab, self.seq_len, self.rows = 50_304, 1000, 8  # 1000: not 128k

    def train_config(self, **update: Any) -> TrainConfig:
        fields = dict(
            max_steps=10**9,
            micro_batch_rows=self.rows,
            warmup_steps=0,
            precision="bf16",
            device=self.device.type,
            threads=0 if self.cuda else 2,
        )
        fields.update(update)
        return TrainConfig(**fields)

    def batches(self, count: int, seed: int = 0, rows: int | None = None) -> list[Any]:
        return gpu_train.packed(rows or self.rows, self.seq_len, self.vocab, count, seed)

    def trainer(self, cfg: TrainConfig, data: list[Any], world: World | None = None) -> Trainer:
        """A trainer built as a run builds one: determinism first, the model on meta."""
        determinism(cfg)
        world = world or World().placed(self.device.type, "none")
        model = GPT(self.model, self.vocab, device="meta")
        engine = parallelize(model, world, cfg)
        optimizer = build_optimizer(model, cfg)
        return Trainer(model, optimizer, cfg, iter(data), "isolated", world=world, engine=engine)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


# -- the sections ---------------------------------------------------------------------


def cuda_tests(c: Check) -> dict[str, Any]:
    if not c.cuda:
        raise Skip("needs CUDA")
    files = subprocess.run(
        ["grep", "-rl", "needs a CUDA", str(ROOT / "tests")], capture_output=True, text=True
    ).stdout.split()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    return {"ok": proc.returncode == 0, "files": files, "summary": summary, **counts}


def trainer(c: Check) -> dict[str, Any]:
    out: dict[str, Any] = {"seq_len": c.seq_len}
    for compiled in (False, True):
        cfg = c.train_config(compile=compiled)
        t = c.trainer(cfg, c.batches(4) * 2)
        start = time.perf_counter()
        losses = [float(t.train_step()) for _ in range(6)]
        c.sync()
        name = "compiled" if compiled else "eager"
        out[name] = {"losses": losses, "seconds": time.perf_counter() - start}
    finite = all(math.isfinite(x) for k in ("eager", "compiled") for x in out[k]["losses"])
    out["ok"] = finite and torch.are_deterministic_algorithms_enabled()
    return out


def resume(c: Check) -> dict[str, Any]:
    k = 3
    data = c.batches(2 * k, seed=1)
    cfg = c.train_config(precision="fp32" if not c.cuda else "bf16")
    whole = c.trainer(cfg, data)
    for _ in range(2 * k):
        whole.train_step()
    first = c.trainer(cfg, data)
    for _ in range(k):
        first.train_step()
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp) / "ckpt", first.model, {"step": k}, first.optimizer)
        second = c.trainer(cfg, data[k:])
        load_checkpoint(Path(tmp) / "ckpt", second.model, second.optimizer, restore_rng=True)
    second.state.step = k
    for _ in range(k):
        second.train_step()
    a, b = whole.model.state_dict(), second.model.state_dict()
    differing = [name for name in a if not torch.equal(a[name], b[name])]
    return {"ok": not differing, "updates": 2 * k, "differing_tensors": differing}


def head_loss_error(c: Check) -> dict[str, Any]:
    vocab = c.vocab if c.tiny else 50_304
    n, d = (512, 64) if c.tiny else (8192, 768)
    gen = torch.Generator(c.device).manual_seed(0)
    x = torch.randn(n, d, device=c.device, generator=gen)
    w = torch.randn(vocab, d, device=c.device, generator=gen) * d**-0.5
    t = torch.randint(0, vocab, (n,), device=c.device, generator=gen)
    weights = torch.ones(n, dtype=torch.float64, device=c.device)
    x1, w1 = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.cross_entropy((x1 @ w1.t()).float(), t, reduction="sum")
    ref.backward()
    x2, w2 = x.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast(c.device.type, dtype=torch.bfloat16):
        got = head_loss(x2, w2, t, weights)
    got.backward()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    out = {
        "vocab": vocab,
        "rows": n,
        "loss_rel_error": abs(got.item() - ref.item()) / abs(ref.item()),
        "grad_x_rel_error": rel(x2.grad, x1.grad),
        "grad_w_rel_error": rel(w2.grad, w1.grad),
    }
    out["ok"] = (
        out["loss_rel_error"] < 1e-2
        and max(out["grad_x_rel_error"], out["grad_w_rel_error"]) < 5e-2
    )
    return out


def recompiles(c: Check) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    layouts = [c.batches(1, seed=s)[0] for s in range(5)]
    short = c.batches(1, seed=9, rows=max(1, c.rows // 2))[0]  # a short last batch
    t = c.trainer(c.train_config(compile=True), layouts)
    t.train_step()
    first = counters["stats"]["unique_graphs"]
    for _ in layouts[1:]:
        t.train_step()
    layouts_graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad(), t.autocast():
        evaluate(t.model, [short], "isolated", ["all"], t.world)
    return {
        "ok": layouts_graphs == first,  # new layouts of the same shape: no new graph
        "layouts": len(layouts),
        "graphs_after_first_step": first,
        "graphs_after_all_layouts": layouts_graphs,
        "graphs_after_short_eval": counters["stats"]["unique_graphs"],
    }


def mask_build(c: Check) -> dict[str, Any]:
    from torch.nn.attention.flex_attention import create_block_mask

    from ledgerlm.model.attention import document_mask_mod

    compiled = torch.compile(create_block_mask)
    out: dict[str, Any] = {}
    for length in (256, 512) if c.tiny else (1024, 4096):
        doc = torch.sort(torch.randint(0, 8, (c.rows, length), device=c.device), dim=1).values
        times = {}
        for name, build in (("eager", create_block_mask), ("compiled", compiled)):
            build(document_mask_mod(doc), c.rows, None, length, length, device=c.device)
            c.sync()
            start = time.perf_counter()
            for _ in range(5):
                build(document_mask_mod(doc), c.rows, None, length, length, device=c.device)
            c.sync()
            times[name] = 1e3 * (time.perf_counter() - start) / 5
        out[f"T{length}_ms"] = times
    out["ok"] = True
    return out


@contextlib.contextmanager
def one_rank_group(c: Check):
    """A process group of one rank, for FSDP2 without torchrun."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29_000 + os.getpid() % 1000))
    dist.init_process_group("nccl" if c.cuda else "gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def fsdp(c: Check) -> dict[str, Any]:
    import dataclasses

    from torch.distributed.device_mesh import init_device_mesh

    out: dict[str, Any] = {}
    with one_rank_group(c):
        mesh = init_device_mesh(c.device.type, (1,))
        world = dataclasses.replace(World(), device=c.device, parallel="fsdp", mesh=mesh)
        cfg = c.train_config(precision="bf16" if c.cuda else "fp32", grad_clip=0)
        data = c.batches(4, seed=2)
        seen: list[str] = []

        def build() -> Trainer:
            determinism(cfg)
            model = GPT(c.model, c.vocab, device="meta")
            engine = parallelize(model, world, cfg, bf16_params=c.cuda)
            model.register_forward_pre_hook(  # for the model's life: no handle kept
                lambda m, a, kw: seen.append(str(kw["weights"].dtype)) if "weights" in kw else None,
                with_kwargs=True,
            )
            optimizer = build_optimizer(model, cfg)
            return Trainer(
                model, optimizer, cfg, iter(data), "isolated", world=world, engine=engine
            )

        plain = build()
        losses_plain = [plain.train_step() for _ in range(2)]
        between = build()
        first = between.train_step()
        with torch.no_grad(), between.autocast():
            evaluate(between.model, data[:1], "isolated", ["all"], world)
        second = between.train_step()
        out["weights_dtypes_in_forward"] = sorted(set(seen))
        out["losses_plain"], out["losses_with_eval"] = losses_plain, [first, second]
        same = [first, second] == losses_plain
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(
                Path(tmp) / "ckpt", between.model, {"step": 2}, between.optimizer, world
            )
            other = build()
            load_checkpoint(Path(tmp) / "ckpt", other.model, other.optimizer)
            a = {k: v.full_tensor() for k, v in between.model.state_dict().items()}
            b = {k: v.full_tensor() for k, v in other.model.state_dict().items()}
            out["dcp_round_trip_equal"] = all(torch.equal(a[k], b[k]) for k in a)
    out["eval_between_updates_changes_nothing"] = same
    out["ok"] = (
        same
        and out["dcp_round_trip_equal"]
        and out["weights_dtypes_in_forward"] == ["torch.float64"]
    )
    return out


def host_idle(c: Check) -> dict[str, Any]:
    if not c.cuda:
        raise Skip("needs CUDA (the device's kernels are the profile)")
    from torch.profiler import ProfilerActivity, profile

    t = c.trainer(c.train_config(compile=True), c.batches(4) * 4)
    for _ in range(3):
        t.train_step()
    c.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(8):
            t.update()  # as fit makes each update: no read of the device's values
        c.sync()
        wall_us = 1e6 * (time.perf_counter() - start)
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    busy, end = 0.0, -math.inf
    for s, e in spans:  # the union of kernel intervals
        if e > end:
            busy += e - max(s, end)
            end = e
    window = (spans[-1][1] - spans[0][0]) if spans else wall_us
    return {"ok": True, "device_busy_share": busy / window, "host_idle_share": 1 - busy / window}


def throughput(c: Check) -> dict[str, Any]:
    if c.tiny:
        argv = ["--device", c.device.type, "--d-model", "64", "--layers", "2", "--heads", "2"]
        argv += ["--seq-len", "128", "--vocab", "512", "--rows", "4", "--steps", "3"]
        argv += ["--warmup", "1", "--no-compile"]
    else:
        argv = ["--device", c.device.type, "--steps", "10", "--warmup", "3"]
    out = gpu_train.measure(gpu_train.arguments(argv))
    out["ok"] = out["tokens_per_s"] > 0
    return out


def eval_memory(c: Check) -> dict[str, Any]:
    if not c.cuda:
        raise Skip("needs CUDA (peak device memory)")
    vocab = 50_304
    determinism(c.train_config())
    model = GPT(c.model, vocab, device="meta").materialize(c.device)
    batch = gpu_train.packed(c.rows, c.seq_len, vocab, 1)[0]
    c.sync()
    torch.cuda.reset_peak_memory_stats(c.device)
    base = torch.cuda.memory_allocated(c.device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        evaluate(model, [batch], "isolated", ["all"])
    c.sync()
    peak = torch.cuda.max_memory_allocated(c.device) - base
    logits = c.rows * c.seq_len * vocab * 4  # what fp32 (B, T, V) logits alone would hold
    return {"ok": True, "peak_gb": peak / 2**30, "fp32_logits_gb": logits / 2**30}


SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "cuda_tests": cuda_tests,
    "trainer": trainer,
    "resume": resume,
    "head_loss": head_loss_error,
    "recompiles": recompiles,
    "mask_build": mask_build,
    "fsdp": fsdp,
    "host_idle": host_idle,
    "throughput": throughput,
    "eval_memory": eval_memory,
}


def run(names: list[str], check: Check) -> dict[str, Any]:
    """Every section in ``names``, each on its own: its figures, or why it did not run."""
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(check.device) if check.cuda else "cpu",
        "torch": torch.__version__,
        "tiny": check.tiny,
        "sections": {},
    }
    for name in names:
        start = time.perf_counter()
        try:
            result = SECTIONS[name](check)
        except Skip as why:
            result = {"ok": None, "skipped": str(why)}
        except Exception as exc:  # a section's failure is its report, not the check's end
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            result["traceback"] = traceback.format_exc(limit=6)
        result["seconds"] = round(time.perf_counter() - start, 2)
        report["sections"][name] = result
        state = {True: "ok", False: "FAILED", None: "skipped"}[result["ok"]]
        detail = result.get("skipped") or result.get("error") or ""
        print(f"{name:12} {state:8} {result['seconds']:7.1f} s  {detail}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="small shapes (a CPU smoke run)")
    ap.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run these sections")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; pass --device cpu --tiny", file=sys.stderr)
        return 2
    report = run(args.only or list(SECTIONS), Check(args.device, args.tiny))
    args.out.write_text(json.dumps(report, indent=2, default=str))
    failed = [n for n, r in report["sections"].items() if r["ok"] is False]
    print(f"{args.out}: {len(report['sections'])} sections, failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
