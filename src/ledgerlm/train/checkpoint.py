"""Checkpoints: safetensors weights plus a JSON state, published atomically.

Loading never unpickles anything: weights are safetensors, state is JSON.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ledgerlm.workspace import atomic_write_json, file_sha256, read_json

WEIGHTS = "model.safetensors"
STATE = "state.json"


def save_checkpoint(folder: Path, model: torch.nn.Module, state: dict[str, Any]) -> Path:
    """Write weights and state into a temporary folder, then rename it to ``folder``."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        # Tied weights share storage; save each tensor once under its first name.
        tensors, seen = {}, set()
        for name, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            tensors[name] = t.detach().contiguous()
        save_file(tensors, str(tmp / WEIGHTS))
        atomic_write_json(tmp / STATE, {**state, "weights_sha256": file_sha256(tmp / WEIGHTS)})
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_checkpoint(folder: Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load weights into ``model`` after checking their checksum; return the state."""
    folder = Path(folder)
    state = read_json(folder / STATE)
    if file_sha256(folder / WEIGHTS) != state["weights_sha256"]:
        raise ValueError(f"{folder / WEIGHTS}: checksum mismatch")
    missing, unexpected = model.load_state_dict(load_file(str(folder / WEIGHTS)), strict=False)
    tied = {"lm_head.weight"} if getattr(model.cfg, "tie_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"{folder}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}"
        )
    return state
