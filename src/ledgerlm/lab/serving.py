"""What serving a model costs on this machine (requirement S4), as ``ledgerlm scale
serving-cost`` measures it; the CLI only parses arguments and prints.

The lifecycle allocation charges ``k N`` FLOPs per served token with k = 2 by default:
a forward pass, whatever the batch and the context. ``measure_serving`` times the
model's own decoding (``model.decode``: prefill a (B, T) context, then one token at a
time over the KV cache) and puts it beside two counts:

- analytic: ``flops_per_token`` = 2N + 4 n_layers T d (the matmuls and attention over
  the context), so k = flops / N >= 2, growing with the context;
- training-equivalent, measured: one forward + backward step of a (B, T) batch of the
  same model, timed the same way, costs 6N FLOPs a token by the budget's own
  convention (C = 6ND). A served token that takes s_serve seconds when a trained token
  takes s_train therefore costs ``6 s_serve / s_train`` training-FLOPs per parameter:
  ``effective_flops_per_param``. It carries what the analytic count leaves out (a
  decode step of B rows cannot use the machine as a training batch of B T tokens does),
  and ``scale recommend --serving FILE`` uses it as the serving kappa.

The model is a run's (rebuilt from its stored recipe and checkpoint, as ``lab.export``
does) or a random-initialised one of a stated shape (``parse_shape``): the time of a
forward pass does not depend on the weights' values. Arguments that cannot be honoured
are an ``ArgumentError`` naming the argument (the CLI names its flag).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ledgerlm.config import ModelConfig
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.export import load_run_model
from ledgerlm.model.decode import Decoder, flops_per_token
from ledgerlm.model.gpt import GPT
from ledgerlm.scaling.sweep import N_DEFINITION, heads_for
from ledgerlm.workspace import DEFAULT_WORKSPACE, Workspace, read_json

SCHEMA = "ledgerlm.serving_cost"
SCHEMA_VERSION = 1
TRAINING_FLOPS_PER_PARAM = 6.0  # C = 6 N D: what the training budget charges a token
CONVENTION = (
    "FLOPs per generated token = 2N (matmuls; N = " + N_DEFINITION + ") + 4 n_layers T "
    "d_model (QK^T and AV over the T positions attended, 2 T d each); a multiply-add is 2 "
    "FLOPs; norms, RoPE, softmax and the embedding lookup not counted"
)
_READ_KEYS = ("effective_flops_per_param", "analytic_flops_per_param", "source", "batch",
              "context", "new_tokens", "machine", "device")  # fmt: skip
_SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "vocab", "ffn_mult")


def parse_shape(shape: str) -> tuple[ModelConfig, int]:
    """``d_model=64,n_layers=2,n_heads=2,vocab=512`` -> (ModelConfig, vocab size).

    d_model, n_layers and vocab are required; n_heads defaults to the sweep's rule
    (32-wide heads), ffn_mult to the recipe default. A shape that does not parse is an
    ``ArgumentError`` naming ``shape``."""
    values: dict[str, str] = {}
    for item in shape.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not value.strip():
            raise ArgumentError("{shape}: {item!r} is not KEY=VALUE", item=item.strip())
        if key not in _SHAPE_KEYS:
            raise ArgumentError(
                "{shape}: unknown key {key!r} (known: {known})",
                key=key,
                known=", ".join(_SHAPE_KEYS),
            )
        values[key] = value.strip().replace("_", "")
    missing = [k for k in ("d_model", "n_layers", "vocab") if k not in values]
    if missing:
        raise ArgumentError("{shape}: missing {missing}", missing=", ".join(missing))
    try:
        ints = {k: int(v) for k, v in values.items() if k != "ffn_mult"}
        extra = {"ffn_mult": float(values["ffn_mult"])} if "ffn_mult" in values else {}
    except ValueError:
        raise ArgumentError(
            "{shape}: {text!r} holds a value that is not a number", text=shape
        ) from None
    vocab = ints.pop("vocab")
    if vocab < 2:
        raise ArgumentError("{shape}: vocab {vocab} must be >= 2", vocab=vocab)
    ints.setdefault("n_heads", heads_for(ints["d_model"]))
    return ModelConfig(**ints, **extra), vocab


def shape_model(shape: str, seed: int = 0) -> GPT:
    """A random-initialised ``GPT`` of the stated shape (``parse_shape``), the same for the
    same ``seed``: the time of a forward pass does not depend on the weights' values."""
    cfg, vocab = parse_shape(shape)
    torch.manual_seed(seed)
    return GPT(cfg, vocab)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``auto``: CUDA when present, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def describe_machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"CUDA {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    return f"CPU {cpu}, {torch.get_num_threads()} torch threads of {os.cpu_count()} cores"


@dataclass
class ServingCost:
    """One measurement; ``to_dict`` is the JSON ``scale serving-cost -o`` writes."""

    source: str  # "run <id>" or "shape"
    model: dict[str, Any]  # d_model, n_layers, n_heads, vocab, ffn_mult, N
    batch: int
    context: int
    new_tokens: int
    repeats: int
    device: str
    machine: str
    threads: int
    dtype: str
    prefill_seconds: float  # one (B, T) prefill
    step_seconds: float  # one decode step of the whole batch
    seconds_per_token: float  # step_seconds / batch
    tokens_per_s: float  # batch / step_seconds
    flops_per_token: dict[str, float]  # at the context: matmul, attention, total
    flops_per_token_timed: float  # mean over the timed steps (contexts T+1 .. T+K)
    achieved_flops_per_s: float
    train_seconds_per_token: float  # one forward + backward of a (B, T) batch / (B T)
    train_tokens_per_s: float
    analytic_flops_per_param: float  # flops_per_token total / N
    effective_flops_per_param: float  # 6 seconds_per_token / train_seconds_per_token

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            **asdict(self),
            "convention": CONVENTION,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _decode_once(model: GPT, context: torch.Tensor, new_tokens: int, device) -> tuple[float, float]:
    """(prefill seconds, seconds of ``new_tokens`` decode steps), greedy."""
    decoder = Decoder(model, context.shape[1] + new_tokens)
    box: dict[str, torch.Tensor] = {}

    def prefill():
        box["token"] = decoder(context)[:, -1].argmax(-1, keepdim=True)

    def steps():
        token = box["token"]
        for _ in range(new_tokens):
            token = decoder(token)[:, -1].argmax(-1, keepdim=True)

    return _timed(prefill, device), _timed(steps, device)


def _train_step(model: GPT, ids: torch.Tensor) -> Callable[[], None]:
    """One forward + backward of next-token loss over (B, T+1) ids (no optimizer)."""
    inputs, targets = ids[:, :-1], ids[:, 1:]
    b, t = inputs.shape
    positions = torch.arange(t, device=ids.device).expand(b, t)
    doc_ids = torch.zeros(b, t, dtype=torch.long, device=ids.device)

    def step() -> None:
        mask = model.attention_spec(doc_ids, "cross")
        logits = model(inputs, positions, mask)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
        model.zero_grad(set_to_none=True)

    return step


def measure_serving(
    model: GPT | str | None,
    batch: int,
    context: int,
    new_tokens: int = 16,
    repeats: int = 5,
    device: str | torch.device | None = None,
    *,
    workspace: Workspace | None = None,
    source: str | None = None,
    seed: int = 0,
    threads: int | None = None,
    shape: str | None = None,
) -> ServingCost:
    """Time ``model``'s decoding of ``batch`` rows after a ``context``-token prompt.

    ``model``: a ``GPT``, or a run (id or unique part of one) in ``workspace``; or None
    and a ``shape`` (``shape_model``: random weights, seeded). One
    untimed warm-up, then ``repeats`` times: a fresh cache, the prefill, ``new_tokens``
    decode steps (the median step is reported), each followed by a forward + backward
    step of a (batch, context) training batch of the same model (median), for the
    training-equivalent cost (module doc). ``threads``: torch's CPU threads for the
    measurement (default: as set); on a machine other processes also use, fewer
    threads than cores avoid parallel ops stalling on a descheduled thread.
    """
    if (model is None) == (shape is None):
        raise ArgumentError("give {model} or {shape} d_model=..,n_layers=..,vocab=.., not both")
    for name, value in (("batch", batch), ("context", context), ("new tokens", new_tokens),
                        ("repeats", repeats)):  # fmt: skip
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if shape is not None:
        model = shape_model(shape)
    if isinstance(model, str):
        loaded = load_run_model(workspace or Workspace(DEFAULT_WORKSPACE), model, purpose="serve")
        model, run_id = loaded.model, loaded.run_id
        source = source or f"run {run_id}"
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(model, batch, context, new_tokens, repeats, device, source, seed)
    finally:
        torch.set_num_threads(before)


def _measure(
    model: GPT,
    batch: int,
    context: int,
    new_tokens: int,
    repeats: int,
    device: str | torch.device | None,
    source: str | None,
    seed: int,
) -> ServingCost:
    """``measure_serving`` once the model is known and the threads are set."""
    dev = resolve_device(device)
    model = model.to(dev)
    cfg, vocab = model.cfg, model.vocab_size
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, context + 1), generator=g).to(dev)
    prompt = ids[:, :context]

    was_training = model.training
    train = _train_step(model, ids)
    runs, trains = [], []
    # serving and training alternate, so both see the same load on a shared machine;
    # the first of each is a warm-up (allocation, kernel choice)
    for _ in range(repeats + 1):
        model.eval()
        with torch.inference_mode():
            runs.append(_decode_once(model, prompt, new_tokens, dev))
        model.train()
        trains.append(_timed(train, dev))
    model.train(was_training)
    prefill = statistics.median(r[0] for r in runs[1:])
    step_s = statistics.median(r[1] for r in runs[1:]) / new_tokens
    train_s = statistics.median(trains[1:])
    train_per_token = train_s / (batch * context)

    at = flops_per_token(cfg, vocab, context)
    # the k-th timed step (k = 1 .. K) attends over T + k positions
    timed = flops_per_token(cfg, vocab, context + (new_tokens + 1) / 2).total
    per_token = step_s / batch
    shape = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
             "vocab": vocab, "ffn_mult": cfg.ffn_mult, "N": at.N}  # fmt: skip
    return ServingCost(
        source=source or "shape",
        model=shape,
        batch=batch,
        context=context,
        new_tokens=new_tokens,
        repeats=repeats,
        device=str(dev),
        machine=describe_machine(dev),
        threads=torch.get_num_threads(),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        prefill_seconds=prefill,
        step_seconds=step_s,
        seconds_per_token=per_token,
        tokens_per_s=batch / step_s,
        flops_per_token={"matmul": at.matmul, "attention": at.attention, "total": at.total},
        flops_per_token_timed=timed,
        achieved_flops_per_s=timed / per_token,
        train_seconds_per_token=train_per_token,
        train_tokens_per_s=1.0 / train_per_token,
        analytic_flops_per_param=at.per_param,
        effective_flops_per_param=TRAINING_FLOPS_PER_PARAM * per_token / train_per_token,
    )


def read_serving_cost(path: Path) -> tuple[float, dict[str, Any]]:
    """The measured training-equivalent serving FLOPs per parameter per token of a
    ``scale serving-cost -o`` file, and what it measured (for the lifecycle output)."""
    try:
        data = read_json(Path(path))
    except ValueError as exc:  # json.JSONDecodeError
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a `scale serving-cost` file (no schema {SCHEMA!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: serving-cost schema version {data.get('schema_version')!r}, "
            f"this ledgerlm reads {SCHEMA_VERSION}"
        )
    missing = [k for k in _READ_KEYS if k not in data]
    if missing:
        raise ValueError(f"{path}: serving-cost file without {', '.join(missing)}")
    kappa = data.get("effective_flops_per_param")
    if not isinstance(kappa, int | float) or not (math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"{path}: effective_flops_per_param {kappa!r} is not a positive number")
    about = {
        "file": str(path),
        "kind": "measured",
        "flops_per_param": float(kappa),
        **{k: data[k] for k in _READ_KEYS if k != "effective_flops_per_param"},
    }
    return float(kappa), about
