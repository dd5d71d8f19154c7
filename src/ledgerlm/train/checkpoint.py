"""Checkpoints: safetensors tensors plus a JSON state, published atomically.

A checkpoint folder holds ``model.safetensors`` (weights), ``state.safetensors``
(optimizer state tensors and the generator states: torch's CPU generator, and the
training GPU's where there is one, ``train/rng.py``) and ``state.json``
(everything else: optimizer scalars and structure, trainer counters, data cursor,
recipe digest). ``state.json`` carries the sha256 of every other file and of its
own content, and loading checks them all before touching the model.

Loading never unpickles code: tensors are safetensors or DCP, the rest is JSON; a
DCP checkpoint's metadata (a pickle PyTorch writes) is read by an unpickler that
accepts DCP's own metadata classes only, its other values as ``weights_only``
(``train/dcp_reading.py``).

A sharded model (FSDP, ``train.parallel = "fsdp"``) is saved by every rank at once
with ``torch.distributed.checkpoint`` (DCP): ``dcp/`` holds each rank's shards of
the weights and optimizer state, ``rng.safetensors`` every rank's generator states,
and ``state.json`` (written by rank 0, with the sha256 of every file) says
``"format": "dcp"``. DCP reshards on load, so such a checkpoint resumes on any
number of ranks, one process included, and a single-process (safetensors)
checkpoint loads into a sharded model.

A new checkpoint is written into a hidden temporary folder and renamed into
place; the one it replaces is first renamed to ``.<name>.previous``, so a process
killed at any moment leaves a complete checkpoint under one of the two names
(``resolve_checkpoint`` finds it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ledgerlm.train.dcp_reading import safe_dcp_reading
from ledgerlm.train.distributed import World
from ledgerlm.train.optim import MultiOptimizer, Optimizer
from ledgerlm.train.rng import (
    by_rank,
    generator_states,
    of_rank,
    restore_generators,
    training_device,
)
from ledgerlm.workspace import atomic_write_json, file_sha256, read_json

WEIGHTS = "model.safetensors"
TENSORS = "state.safetensors"
STATE = "state.json"
DCP_DIR = "dcp"
RNG_FILE = "rng.safetensors"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a file-size limit, no permission);
    the previous checkpoint, if any, is intact. The message is one line, and says
    whether there is one."""


def _cause(exc: BaseException) -> str:
    """The operating system's words for a failed write, from an OSError or from the
    Rust I/O error safetensors wraps (``... message: "No space left on device" ...``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    found = re.search(r'message: "([^"]+)"', text) or re.search(
        r"error: ([^:(]+?) \(os error", text
    )
    return found.group(1) if found else (text.strip().splitlines() or [repr(exc)])[0]


def _json_sha256(state: dict[str, Any]) -> str:
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _parts(optimizer: Optimizer) -> dict[str, torch.optim.Optimizer]:
    return (
        dict(optimizer.optimizers) if isinstance(optimizer, MultiOptimizer) else {"main": optimizer}
    )


def optimizer_state(optimizer: Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer's state into flat-named tensors and a JSON-able structure.

    Keys are ``optimizer/<part>/<param index>/<state key>``; ``<part>`` is the inner
    optimizer's name in a ``MultiOptimizer`` (Muon + AdamW), else ``main``.
    """
    tensors: dict[str, torch.Tensor] = {}
    structure: dict[str, Any] = {}
    for name, opt in _parts(optimizer).items():
        sd = opt.state_dict()
        per_param: dict[str, Any] = {}
        for idx, entry in sd["state"].items():
            values, keys = {}, []
            for key, value in entry.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer/{name}/{idx}/{key}"] = value.detach().cpu().contiguous()
                    keys.append(key)
                else:
                    values[key] = value
            per_param[str(idx)] = {"tensors": keys, "values": values}
        structure[name] = {"param_groups": sd["param_groups"], "state": per_param}
    return tensors, structure


def load_optimizer_state(
    optimizer: Optimizer, tensors: dict[str, torch.Tensor], structure: dict[str, Any]
) -> None:
    """Inverse of ``optimizer_state``; JSON lists become tuples where the optimizer has them."""
    parts = _parts(optimizer)
    if set(structure) != set(parts):
        raise ValueError(f"optimizer state has {sorted(structure)}, expected {sorted(parts)}")
    for name, opt in parts.items():
        saved = structure[name]
        if len(saved["param_groups"]) != len(opt.param_groups):
            raise ValueError(f"optimizer {name}: parameter groups differ from the checkpoint")
        groups = []
        for live, group in zip(opt.param_groups, saved["param_groups"], strict=True):
            groups.append(
                {
                    k: tuple(v) if isinstance(live.get(k), tuple) and isinstance(v, list) else v
                    for k, v in group.items()
                }
            )
        state: dict[int, dict[str, Any]] = {}
        for idx, entry in saved["state"].items():
            values = dict(entry["values"])
            for key in entry["tensors"]:
                flat = f"optimizer/{name}/{idx}/{key}"
                if flat not in tensors:
                    raise ValueError(f"checkpoint lacks optimizer tensor {flat}")
                # A copy in torch's own (aligned) memory: the optimizer would otherwise
                # keep views into the file buffer, whose alignment varies between loads.
                values[key] = tensors[flat].clone()
            state[int(idx)] = values
        opt.load_state_dict({"state": state, "param_groups": groups})


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _previous(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.previous"


def resolve_checkpoint(folder: Path) -> Path:
    """``folder``, or the checkpoint it replaced when a save was killed between renames."""
    folder = Path(folder)
    if not (folder / STATE).is_file() and (_previous(folder) / STATE).is_file():
        return _previous(folder)
    return folder


def save_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    state: dict[str, Any],
    optimizer: Optimizer | None = None,
    world: World | None = None,
) -> Path:
    """Write weights, optimizer state, RNG state and ``state`` into a temporary folder,
    then rename it to ``folder`` (see the module doc for the crash-safe replacement).

    A write that fails (full disk, file-size limit) raises ``CheckpointWriteError``
    naming the folder and the cause; nothing of the new checkpoint is left, and the
    previous one stays where it was."""
    folder = Path(folder)
    world = world or World()
    earlier = (resolve_checkpoint(folder) / STATE).is_file()
    try:
        if world.sharded:
            return _save_sharded(folder, model, state, optimizer, world)
        return _save(folder, model, state, optimizer)
    except (OSError, SafetensorError) as exc:
        step = state.get("step")
        at = f" at step {step}" if step is not None else ""
        kept = "the previous one is intact" if earlier else "there is no earlier one"
        raise CheckpointWriteError(
            f"{folder}: checkpoint{at} not written ({_cause(exc)}); {kept}"
        ) from exc


def _save(
    folder: Path, model: torch.nn.Module, state: dict[str, Any], optimizer: Optimizer | None
) -> Path:
    with _temporary(folder) as tmp:
        # Tied weights share storage; save each tensor once under its first name.
        weights, seen = {}, set()
        for name, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            weights[name] = t.detach().cpu().contiguous()
        save_file(weights, str(tmp / WEIGHTS))
        tensors = generator_states(training_device(model))
        full = dict(state)
        if optimizer is not None:
            opt_tensors, full["optimizer"] = optimizer_state(optimizer)
            tensors.update(opt_tensors)
        save_file(tensors, str(tmp / TENSORS))
        _publish(tmp, folder, full, [WEIGHTS, TENSORS])
    return folder


@contextmanager
def _temporary(folder: Path) -> Iterator[Path]:
    """A fresh hidden folder beside ``folder`` to write the new checkpoint into (after
    removing those of killed saves), removed unless it was published, however the save
    ends: it is made inside the block that removes it, so even an interrupt (Ctrl-C,
    SIGTERM) arriving just after it appears leaves nothing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):  # left by a killed save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.parent / f".{folder.name}.tmp-{secrets.token_hex(4)}"
    try:
        tmp.mkdir(mode=0o700)
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, folder: Path, state: dict[str, Any], files: list[str]) -> None:
    """Checksum ``files`` into ``state``, write it as state.json, make everything durable,
    then rename ``tmp`` over ``folder`` (keeping the replaced one until the rename)."""
    state["sha256"] = {name: file_sha256(tmp / name) for name in files}
    state["state_sha256"] = _json_sha256(state)
    atomic_write_json(tmp / STATE, state)
    for name in files:
        _fsync(tmp / name)
    _fsync(tmp)
    previous = _previous(folder)
    if folder.exists():  # else ``previous`` may be the only complete one: keep it
        if previous.exists():
            shutil.rmtree(previous)
        os.rename(folder, previous)
    os.rename(tmp, folder)
    _fsync(folder.parent)
    shutil.rmtree(previous, ignore_errors=True)


def _save_sharded(
    folder: Path,
    model: torch.nn.Module,
    state: dict[str, Any],
    optimizer: Optimizer | None,
    world: World,
) -> Path:
    """Every rank writes its shards with DCP into one temporary folder (named by rank 0);
    rank 0 then adds the ranks' generator states and state.json and publishes it."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    with _temporary(folder) if world.is_main else nullcontext() as tmp:
        tmp_dir = Path(world.broadcast_object(None if tmp is None else str(tmp)))
        dcp.save(_distributed_state(model, optimizer), checkpoint_id=tmp_dir / DCP_DIR)
        rngs: list[Any] = [None] * world.size
        dist.all_gather_object(rngs, generator_states(training_device(model)))
        if world.is_main:
            save_file(by_rank(rngs), str(tmp_dir / RNG_FILE))
            files = sorted(str(p.relative_to(tmp_dir)) for p in tmp_dir.rglob("*") if p.is_file())
            full = {**state, "format": "dcp", "ranks": world.size}
            _publish(tmp_dir, folder, full, files)
        world.barrier()
    return folder


def _distributed_state(model: torch.nn.Module, optimizer: Optimizer | None) -> dict[str, Any]:
    """Model (and optimizer) state as DCP saves and loads it: keyed by parameter name,
    sharded tensors for a sharded model, whole ones otherwise."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, list(_parts(optimizer).values()))
    return {"model": model_sd, "optim": optim_sd}


def _load_distributed(
    folder: Path, model: torch.nn.Module, optimizer: Optimizer | None, restore_rng: bool
) -> None:
    """Load a DCP checkpoint into ``model`` (and ``optimizer``), whatever their sharding
    (DCP reshards), and this rank's generator state (rank 0's for a rank it lacks)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    sd = _distributed_state(model, optimizer)
    single = not dist.is_initialized()
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        reader, planner = safe_dcp_reading(folder / DCP_DIR)
        dcp.load(sd, storage_reader=reader, planner=planner, no_dist=single)
    if optimizer is None:
        set_model_state_dict(model, sd["model"])
    else:
        optimizers = list(_parts(optimizer).values())
        set_state_dict(
            model, optimizers, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
        )
    if restore_rng:
        rngs = load_file(str(folder / RNG_FILE))
        rank = 0 if single else dist.get_rank()
        restore_generators(of_rank(rngs, rank), training_device(model))


def _sharded(model: torch.nn.Module) -> bool:
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def _load_whole_into_sharded(
    folder: Path,
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: Optimizer | None,
    restore_rng: bool,
) -> None:
    """A single-process (safetensors) checkpoint into a sharded model: rank 0 alone reads
    the tensors and broadcasts them one at a time (``broadcast_from_rank0``), each rank
    keeping its shards, so no other rank holds the file in memory; the optimizer state,
    saved by parameter index, is matched to parameter names through the new optimizer's
    groups (which every rank builds from state.json). Every rank takes the one
    process's generator states."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    main = dist.get_rank() == 0
    # a tied head is not saved (not strict); rank 0's whole tensors reach every rank
    whole = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=True)
    set_model_state_dict(model, load_file(str(folder / WEIGHTS)) if main else {}, options=whole)
    if optimizer is None and not restore_rng:
        return
    if not (folder / TENSORS).is_file():  # every rank says so: none waits for rank 0
        raise ValueError(f"{folder}: weights-only checkpoint, nothing to resume from")
    tensors = load_file(str(folder / TENSORS)) if main else {}
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        for part, opt in _parts(optimizer).items():
            saved = state["optimizer"][part]
            order = [names[id(p)] for g in opt.param_groups for p in g["params"]]
            groups = []
            for live, group in zip(opt.param_groups, saved["param_groups"], strict=True):
                named = [names[id(p)] for p in live["params"]]
                groups.append({**group, "params": named})
            per_name: dict[str, dict[str, Any]] = {}
            held = saved["state"] if main else {}  # the other ranks' tensors come from 0
            for idx, entry in held.items():
                values = dict(entry["values"])
                for key in entry["tensors"]:
                    values[key] = tensors[f"optimizer/{part}/{idx}/{key}"].clone()
                per_name[order[int(idx)]] = values
            set_optimizer_state_dict(
                model, opt, {"state": per_name, "param_groups": groups}, options=whole
            )
    if restore_rng:
        box = [{k: v for k, v in tensors.items() if k.startswith("rng/")}]
        dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
        restore_generators(box[0], training_device(model))


def _verified_state(folder: Path) -> dict[str, Any]:
    try:
        state = read_json(folder / STATE)
    except ValueError as exc:  # a torn or corrupted file must not read as a bad recipe
        raise ValueError(f"{folder / STATE}: unreadable ({exc})") from None
    if "sha256" not in state:  # written before state tensors existed: weights only
        if file_sha256(folder / WEIGHTS) != state["weights_sha256"]:
            raise ValueError(f"{folder / WEIGHTS}: checksum mismatch")
        return state
    if state.get("state_sha256") != _json_sha256(state):
        raise ValueError(f"{folder / STATE}: checksum mismatch")
    for name, digest in state["sha256"].items():
        if file_sha256(folder / name) != digest:
            raise ValueError(f"{folder / name}: checksum mismatch")
    return state


def load_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    optimizer: Optimizer | None = None,
    restore_rng: bool = False,
) -> dict[str, Any]:
    """Check every file's checksum, load weights into ``model`` (and the optimizer's
    state, and the generators when asked: ``train/rng.py``); return the JSON state."""
    folder = resolve_checkpoint(Path(folder))
    state = _verified_state(folder)
    if state.get("format") == "dcp":
        _load_distributed(folder, model, optimizer, restore_rng)
        return state
    if _sharded(model):
        _load_whole_into_sharded(folder, state, model, optimizer, restore_rng)
        return state
    missing, unexpected = model.load_state_dict(load_file(str(folder / WEIGHTS)), strict=False)
    tied = {"lm_head.weight"} if getattr(model.cfg, "tie_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"{folder}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}"
        )
    if optimizer is not None or restore_rng:
        if not (folder / TENSORS).is_file():
            raise ValueError(f"{folder}: weights-only checkpoint, nothing to resume from")
        tensors = load_file(str(folder / TENSORS))
        if optimizer is not None:
            if "optimizer" not in state:
                raise ValueError(f"{folder}: checkpoint has no optimizer state")
            load_optimizer_state(optimizer, tensors, state["optimizer"])
        if restore_rng:
            restore_generators(tensors, training_device(model))
    return state
