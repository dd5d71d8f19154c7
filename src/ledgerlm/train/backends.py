"""Process-wide settings a run fixes at set-up for its device, and the record of them.

- TF32 (``train.tf32``): on CUDA, fp32 matmuls and cuDNN convolutions run on TF32
  tensor cores when the recipe asks, and exactly in fp32 when it does not (the flags
  are set either way, so a run does not inherit them from whatever ran before in the
  process). The CPU has no TF32: the key changes nothing there, and the run says so.
- NCCL: a deterministic run (``train.deterministic``, the default;
  ``lab.build.determinism``) on several GPUs needs each collective to reduce in the
  same order on every run, so that a resumed run repeats the uninterrupted one bit for
  bit. NCCL's tuner picks the algorithm per message size and topology, and NVLink
  SHARP (NVLS) and CollNet reduce inside the switches, in an order of their own;
  ``NCCL_PINNED`` fixes the ring and turns both off, before the first NCCL
  communicator exists (NCCL reads its environment then). A value the user exported is
  kept. torchtitan's batch-invariance switch pins the same three, and more (one
  channel, one thread) that only invariance across batch shapes needs.

``environment`` is what the run records of them (a ``environment`` event at every
start and resume): the device, the torch, CUDA and NCCL versions, whether TF32 and
deterministic kernels are in force, and every ``NCCL_*`` variable of this process.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

import torch

from ledgerlm.config import TrainConfig
from ledgerlm.train.distributed import World

NCCL_PINNED = {
    "NCCL_ALGO": "Ring",  # not Tree, PAT or NVLS, whichever the tuner would pick per size
    "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP: the NVSwitch reduces
    "NCCL_COLLNET_ENABLE": "0",  # SHARP in the network switches, likewise
}


def pin_nccl(world: World, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """On CUDA under torchrun, ``NCCL_PINNED`` into the environment, each unless the
    user set it; returns those set here. Nothing elsewhere (gloo has no such choice)."""
    environ = os.environ if environ is None else environ
    if world.device.type != "cuda" or not world.distributed:
        return {}
    pinned = {k: v for k, v in NCCL_PINNED.items() if k not in environ}
    environ.update(pinned)
    return pinned


def nccl_settings(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Every ``NCCL_*`` variable in force in this process, by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_")}


def set_tf32(train: TrainConfig, device: torch.device) -> bool:
    """TF32 on CUDA as ``train.tf32`` says (on or off); True when it is now in force.
    The CPU's flags are not touched: it has no TF32."""
    if device.type != "cuda":
        return False
    # the legacy switches: they set cuBLAS and both cuDNN flags together, and keep
    # every reader (the legacy and the per-backend ones) consistent
    torch.backends.cuda.matmul.allow_tf32 = train.tf32
    torch.backends.cudnn.allow_tf32 = train.tf32
    return train.tf32


def set_up(train: TrainConfig, world: World) -> None:
    """The settings above, once per process before the model is built (NCCL pinned
    only for a deterministic run, ``train.deterministic``)."""
    if train.deterministic:
        pin_nccl(world)
    set_tf32(train, world.device)


def tf32_note(train: TrainConfig, world: World) -> str | None:
    """What to tell the user when the recipe asks for TF32 where there is none."""
    if train.tf32 and world.device.type != "cuda":
        return f"train.tf32 = true changes nothing on {world.device.type}: matmuls stay fp32"
    return None


def environment(world: World) -> dict[str, Any]:
    """What the run records of its process: device, versions, TF32 and deterministic
    kernels in force, NCCL."""
    cuda = world.device.type == "cuda"
    record: dict[str, Any] = {
        "device": str(world.device),
        "ranks": world.size,
        "torch": torch.__version__,
        "tf32": cuda and bool(torch.backends.cuda.matmul.allow_tf32),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "nccl": nccl_settings(),
    }
    if cuda:
        record["device_name"] = torch.cuda.get_device_name(world.device)
        record["cuda"] = torch.version.cuda
        if torch.distributed.is_nccl_available():
            record["nccl_version"] = ".".join(str(n) for n in torch.cuda.nccl.version())
    return record
