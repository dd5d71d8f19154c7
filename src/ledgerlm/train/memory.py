"""The memory one training process needs for a recipe, estimated from its shapes before
anything is built, and the memory its device has: a recipe that cannot fit is refused in
one line instead of dying in the allocator after the data stages and the model.

Per process (per rank under ``torchrun``), at the step's peak:

- parameters: fp32, counted on a ``meta`` model (no memory); under FSDP each rank keeps
  1/size of them, plus the root (embedding, head) and two blocks gathered at a time;
- gradients: as the parameters; DDP adds its gradient buckets (a second copy); FSDP
  keeps each rank's shard, and under ``grad_accum > 1`` the whole gradients too until
  the last micro-batch reduce-scatters them (the loop defers the gradient sync);
- optimizer: AdamW keeps two fp32 states per parameter, Muon one (its momentum) for
  the block matrices, which leaves AdamW's two for the rest;
- activations: what autograd saves in one micro-batch's forward pass
  (``saved_activations``), the backward pass's working set (one MLP's gradients), and
  the allocator's slack; with activation checkpointing, each block's input plus one
  block recomputed;
- evaluation: one forward of the largest validation batch without gradients, whose
  head is scored a chunk of rows at a time (fp32 logits of one chunk, as in the step),
  or with an exact task the larger generation: its prefill of ``micro_batch_rows``
  prompts up to ``seq_len`` tokens, whose KV cache and (B, T, V) logits (the decoder
  returns every position's) are whole; it happens after an update, when
  the gradients are still held, so the peak is the larger of it and the step (both,
  and a copy of the weights, when evaluation is asynchronous);
- other: the validation and test batches held in memory, bf16 copies of the weights
  under autocast, and torch's own working memory on the first step.

``tests/train/test_memory.py`` compares the estimate with the peak resident memory of
real steps of small models on the CPU.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

from ledgerlm.config import Recipe
from ledgerlm.model.attention import choose_backend
from ledgerlm.model.gpt import GPT, ffn_hidden
from ledgerlm.model.head_loss import HEAD_CHUNK_BYTES, HEAD_CHUNK_BYTES_ACCELERATOR
from ledgerlm.train.distributed import World
from ledgerlm.train.optim import muon_params

GIB = 2**30
MARGIN = 0.9  # the share of the available memory a recipe may plan to use
# Freed blocks below glibc's mmap threshold (up to 32 MiB) stay in the heap, so a step's
# resident peak exceeds its live tensors (1.0-1.5x measured on the CPU).
ALLOCATOR_SLACK = 1.25
# Beyond any tensor: on the CPU torch's kernels, thread pools and allocator pages on the
# first step (0.09 GiB measured: a 2-layer model, one row); on CUDA cuBLAS workspaces
# and the caching allocator's rounding (not measured here).
RUNTIME_BYTES = {"cpu": 128 * 2**20, "cuda": 512 * 2**20}
HELD_OUT_BYTES_PER_TOKEN = 5 * 8 + 2  # a Batch: five int64 and two bool (B, T) tensors


class WontFitError(ValueError):
    """A recipe that cannot fit in the memory of its device (a one-line error)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process at the step's peak (see the module doc)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int  # one micro-batch's forward and backward
    evaluation: int  # one validation batch's forward, its head in chunks
    other: int  # held-out batches, autocast weight copies, the runtime
    overlap: bool  # evaluation runs beside training (asynchronous)
    rows: int
    seq_len: int

    @property
    def total(self) -> int:
        if self.overlap:
            work = self.activations + self.evaluation
        else:
            work = max(self.activations, self.evaluation)
        return self.parameters + self.gradients + self.optimizer + work + self.other

    def parts(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "evaluation": self.evaluation,
            "other": self.other,
        }

    def describe(self) -> str:
        """``41.3 GiB (parameters 0.2, ..., activations 40.7 for 100,000 rows x 128
        tokens, ...)``."""
        shown = []
        for name, n in self.parts().items():
            text = f"{name} {n / GIB:.1f}"
            if name == "activations":
                text += f" for {self.rows:,} rows x {self.seq_len:,} tokens"
            shown.append(text)
        return f"{self.total / GIB:.1f} GiB ({', '.join(shown)})"


def saved_activations(
    rows: int,
    seq_len: int,
    d_model: int,
    n_heads: int,
    ffn: int,
    width: int,
    mask: bool,
) -> int:
    """Bytes autograd saves in one block's forward for the backward pass.

    ``width`` is the bytes of a matmul's output (4 in fp32, 2 under bf16 autocast);
    the residual stream and the norms stay fp32. Per block: each RMSNorm keeps its input
    and the normalized tensor (fp32) and the next matmul its output; attention keeps
    q, k (after RoPE), v and its output, and the output projection its input; the MLP
    keeps the gate's output, its SiLU, the up projection and their product; SDPA with
    an explicit mask (the CPU path) keeps a (B, 1, T, T) copy of the mask in the
    activations' dtype, and every path a (B, nh, T) log-sum-exp.
    """
    n = rows * seq_len
    norms = 2 * (2 * 4 + width) * n * d_model
    attention = 5 * width * n * d_model + 4 * rows * n_heads * seq_len
    mlp = 4 * width * n * ffn
    scores = width * rows * seq_len * seq_len if mask else 0
    return norms + attention + mlp + scores


def estimate(recipe: Recipe, vocab_size: int, world: World) -> MemoryEstimate:
    """The memory one process of ``world`` needs to train ``recipe`` on a vocabulary of
    ``vocab_size`` (see the module doc for what each part holds)."""
    bf16 = recipe.train.precision == "bf16"
    parameters, gradients, optimizer, present, local = _weights(recipe, vocab_size, world)
    activations = _step(recipe, vocab_size, world)
    evaluation, val_rows = _evaluation(recipe, vocab_size, world)
    if recipe.eval.asynchronous:
        evaluation += 4 * local  # the copy of this rank's weights it scores
    held_out = 2 if recipe.data.test_fraction > 0 else 1
    other = held_out * val_rows * recipe.pack.seq_len * HELD_OUT_BYTES_PER_TOKEN
    other += 2 * present if bf16 else 0  # autocast's bf16 copies of the weights
    other += RUNTIME_BYTES.get(world.device.type, RUNTIME_BYTES["cuda"])
    return MemoryEstimate(
        parameters,
        gradients,
        optimizer,
        activations,
        evaluation,
        other,
        recipe.eval.asynchronous,
        recipe.train.micro_batch_rows,
        recipe.pack.seq_len,
    )


def _weights(recipe: Recipe, vocab_size: int, world: World) -> tuple[int, ...]:
    """Bytes of parameters, gradients and optimizer state on one rank, and how many
    parameters it holds whole during a step and as its own."""
    m, t = recipe.model, recipe.train
    model = GPT(m, vocab_size, device="meta")  # shapes only, no memory
    total = sum(p.numel() for p in model.parameters())  # a tied weight counts once
    hidden = sum(p.numel() for p in muon_params(model)) if t.optimizer == "muon" else 0
    state = 4 * hidden + 8 * (total - hidden)
    if not world.sharded:
        ddp = 2 if world.parallel == "ddp" else 1  # DDP's gradient buckets
        return 4 * total, 4 * total * ddp, state, total, total
    # Each rank keeps 1/size of the weights, their gradients and their state; it gathers
    # the root (embedding, head) for the step and two blocks at a time (one running, one
    # prefetched), and holds one block's whole gradients until they are scattered: all
    # the blocks' under gradient accumulation, whose reduce-scatter waits for the last
    # micro-batch (the loop's set_requires_gradient_sync).
    shard = math.ceil(total / world.size)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    gathered = total - block * m.n_layers + min(2, m.n_layers) * block
    width = 2 if t.precision == "bf16" and world.device.type == "cuda" else 4
    parameters = 4 * shard + width * gathered
    unsharded = 4 * total if t.grad_accum > 1 else 4 * block
    return parameters, 4 * shard + unsharded, math.ceil(state / world.size), gathered, shard


def _step(recipe: Recipe, vocab_size: int, world: World) -> int:
    """Bytes of one micro-batch's forward and backward beyond the weights."""
    m, t = recipe.model, recipe.train
    width = 2 if t.precision == "bf16" else 4
    rows, seq = t.micro_batch_rows, recipe.pack.seq_len
    n, d, ffn = rows * seq, m.d_model, ffn_hidden(m)
    head_dim = d // m.n_heads
    backend = choose_backend(world.device, recipe.pack.attention, m.attention_backend, head_dim)
    layer = saved_activations(rows, seq, d, m.n_heads, ffn, width, backend == "sdpa")
    layers = layer * m.n_layers
    if t.activation_checkpointing:  # the blocks' inputs, and one block recomputed
        layers = 4 * n * d * m.n_layers + layer
    rope = 4 * n * head_dim  # cos and sin, (B, 1, T, hs/2) each
    masks = rows * seq * seq if backend == "sdpa" else 0  # the (B, 1, T, T) bool mask
    chunk = HEAD_CHUNK_BYTES if world.device.type == "cpu" else HEAD_CHUNK_BYTES_ACCELERATOR
    chunk = max(chunk, 64 * 4 * vocab_size)
    # the final norm's input and normalized tensor, the head's gradient wrt its input
    # (N, d) and wrt its weight (V, d), two chunks of logits
    head = 3 * 4 * n * d + 4 * vocab_size * d + 2 * chunk
    backward = 3 * width * n * ffn + 2 * 4 * n * d  # one MLP's gradients in flight
    return round(ALLOCATOR_SLACK * (layers + rope + masks + head + backward))


def _evaluation(recipe: Recipe, vocab_size: int, world: World) -> tuple[int, int]:
    """Bytes of one forward of the largest validation batch (or of an exact task's
    prefill, when larger), and the validation rows."""
    m, seq = recipe.model, recipe.pack.seq_len
    width = 2 if recipe.train.precision == "bf16" else 4
    val_rows = math.ceil(recipe.eval.max_tokens / seq) + 1
    rows = min(recipe.train.micro_batch_rows, val_rows)
    # one chunk of the head's logits in fp32 (``head_losses``) and, under bf16, the
    # matmul's bf16 output, and a block's tensors, which the forward without gradients
    # frees as it goes
    chunk = HEAD_CHUNK_BYTES if world.device.type == "cpu" else HEAD_CHUNK_BYTES_ACCELERATOR
    chunk = min(max(chunk, 64 * 4 * vocab_size), 4 * rows * seq * vocab_size)
    head = chunk + (chunk * width // 4 if width < 4 else 0)
    block = rows * seq * (4 * 4 * m.d_model + 3 * width * ffn_hidden(m))
    need = head + block
    if any(t.task_kind == "exact" for t in recipe.eval.tasks):
        n = recipe.train.micro_batch_rows * seq  # a prefill's prompts, at most
        cache = 2 * m.n_layers * n * m.d_model * width  # every layer's keys and values
        logits = width * n * vocab_size  # the head's output at every position
        need = max(need, cache + logits + n * (4 * 4 * m.d_model + 3 * width * ffn_hidden(m)))
    return round(ALLOCATOR_SLACK * need), val_rows


def _cgroup_room(root: Path, own: str) -> int | None:
    """What the memory cgroups of this process still allow (the least, over its group and
    every group above it, of the limit less the memory held, page cache that can be
    dropped excluded), under cgroup v2 or v1; None without a limit. ``own`` is the text
    of ``/proc/self/cgroup``, ``root`` where cgroups are mounted."""
    rooms = []
    for line in own.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            base, names = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, names = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        parts = Path(path.lstrip("/")).parts
        for depth in range(len(parts), -1, -1):
            room = _group_room(base.joinpath(*parts[:depth]), *names)
            if room is not None:
                rooms.append(room)
    return min(rooms, default=None)


def _group_room(folder: Path, limit_file: str, usage_file: str) -> int | None:
    """One cgroup's limit less its usage (inactive page cache excluded); None when it
    sets no limit or is not there."""
    try:
        limit = (folder / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= 2**60:  # v1 writes "no limit" as ~2**63
            return None
        usage = int((folder / usage_file).read_text())
        stat = (folder / "memory.stat").read_text().splitlines()
        cache = sum(int(s.split()[1]) for s in stat if s.startswith("inactive_file "))
    except (OSError, ValueError, IndexError):
        return None
    return max(0, int(limit) - usage + cache)


def _rlimit_room() -> tuple[int, str] | None:
    """What this process's address-space or data-size limit (``ulimit -v``/``-d``) still
    allows; None without one."""
    import psutil

    info = psutil.Process().memory_info()
    found = []
    for kind, used, name in (
        (resource.RLIMIT_AS, info.vms, "left under the address-space limit (ulimit -v)"),
        (
            resource.RLIMIT_DATA,
            getattr(info, "data", info.vms),
            "left under the data-size limit (ulimit -d)",
        ),
    ):
        soft, _ = resource.getrlimit(kind)
        if soft != resource.RLIM_INFINITY:
            found.append((max(0, soft - used), name))
    return min(found) if found else None


def available(world: World) -> tuple[int, str]:
    """The memory one process of ``world`` may still take on its device, and what
    bounds it: the GPU's free memory (shared by the ranks on it), or the RAM available
    (``psutil``), the memory cgroup's room (both shared by this node's ranks) and this
    process's rlimits, whichever is least."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(world.device)
        sharing = max(1, math.ceil(local / torch.cuda.device_count()))
        return free // sharing, f"free on {world.device}" + (
            f" per rank ({sharing} share it)" if sharing > 1 else ""
        )
    import psutil

    sharing = f" per rank ({local} share it)" if local > 1 else ""
    room = [(psutil.virtual_memory().available // local, f"of RAM available{sharing}")]
    try:
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        own = ""
    cgroup = _cgroup_room(Path("/sys/fs/cgroup"), own)
    if cgroup is not None:
        room.append((cgroup // local, f"left in the memory cgroup{sharing}"))
    limit = _rlimit_room()
    if limit is not None:
        room.append(limit)
    return min(room)


def known_vocab(recipe: Recipe) -> int | None:
    """The vocabulary size a recipe trains its tokenizer to (an upper bound: BPE may
    stop short of it), or None for a supplied or reused tokenizer (``train.init_from``
    reuses its run's), whose size the tokens version tells."""
    tok = recipe.tokenizer
    trains = tok.from_ is None and tok.reuse is None and recipe.train.init_from is None
    return tok.vocab_size if trains else None


def check_memory(
    recipe: Recipe,
    world: World,
    vocab_size: int | None = None,
    room: tuple[int, str] | None = None,
) -> MemoryEstimate | None:
    """Refuse a recipe whose estimate exceeds ``MARGIN`` of the memory available to one
    process (``WontFitError``, one line with the estimate, the limit and what to
    change). The vocabulary is the recipe's own when it trains its tokenizer; pass the
    token version's otherwise. Returns the estimate, or None when the vocabulary is not
    known yet or ``train.memory_check`` is off. ``room``: the bytes available and what
    bounds them, as ``available`` finds them (the default)."""
    vocab = vocab_size or known_vocab(recipe)
    if vocab is None or not recipe.train.memory_check:
        return None
    need = estimate(recipe, vocab, world)
    room, bound = room or available(world)
    if need.total <= MARGIN * room:
        return need
    raise WontFitError(
        f"train: the recipe needs about {need.describe()} per process, more than "
        f"{MARGIN:.0%} of the {room / GIB:.1f} GiB {bound}; "
        f"{_advice(recipe, vocab, world, need, MARGIN * room)}, or set "
        "train.memory_check = false to train anyway"
    )


def _advice(recipe: Recipe, vocab: int, world: World, need: MemoryEstimate, limit: float) -> str:
    """What to change, for the largest part of the estimate: the model when the weights
    and their state dominate; else the largest micro-batch that fits (or activation
    checkpointing, when that alone makes the recipe fit)."""
    weights = need.parameters + need.gradients + need.optimizer
    smaller = (
        "use a smaller model (model.d_model, model.n_layers) or shard it over more ranks "
        "(torchrun with train.parallel = 'fsdp')"
    )
    if weights >= max(need.activations, need.evaluation):
        return smaller
    t = recipe.train

    def with_train(**update: object) -> MemoryEstimate:
        changed = recipe.model_copy(update={"train": t.model_copy(update=update)})
        return estimate(changed, vocab, world)

    if not t.activation_checkpointing and with_train(activation_checkpointing=True).total <= limit:
        return "set train.activation_checkpointing = true"
    low, high = 0, t.micro_batch_rows  # the largest number of rows that fits, by bisection
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if with_train(micro_batch_rows=mid).total <= limit else (low, mid)
    if low == 0:
        return smaller
    return (
        f"lower train.micro_batch_rows to {low:,} or fewer (a larger train.grad_accum "
        "keeps the batch)"
    )
