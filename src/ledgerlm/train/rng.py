"""The generator states a checkpoint keeps, so a resumed run draws what the
uninterrupted one would have drawn: torch's CPU generator always, and the CUDA
generator of the device the model trains on where that is a GPU (dropout, sampling or
any random op on the device draws from it).

Only the training device's generator is kept, not every visible GPU's: reading a
device's state creates a context on it, and under torchrun each rank sees all of them.
A checkpoint written on the CPU has no CUDA state, and a CUDA run that resumes one
keeps the generator its seed set (``torch.manual_seed`` seeds every device); a CUDA
checkpoint resumed on the CPU has nothing to put its CUDA state into and leaves it.
"""

from __future__ import annotations

import torch

CPU_KEY = "rng/torch_cpu"
CUDA_KEY = "rng/torch_cuda"


def training_device(model: torch.nn.Module) -> torch.device:
    """Where ``model``'s parameters live (a sharded parameter's device is its shard's)."""
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


def generator_states(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's generator states to save: the CPU's, and ``device``'s on CUDA."""
    states = {CPU_KEY: torch.get_rng_state()}
    if device.type == "cuda":
        states[CUDA_KEY] = torch.cuda.get_rng_state(device)
    return states


def restore_generators(states: dict[str, torch.Tensor], device: torch.device) -> None:
    """Put saved ``states`` back (see the module doc for a state saved or missing)."""
    torch.set_rng_state(states[CPU_KEY])
    if device.type == "cuda" and CUDA_KEY in states:
        torch.cuda.set_rng_state(states[CUDA_KEY], device)


def by_rank(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every rank's states, for one file: ``rng/rank<r>`` (the CPU's) and, where the
    rank trained on CUDA, ``rng/cuda/rank<r>``."""
    flat = {}
    for rank, mine in enumerate(states):
        flat[f"rng/rank{rank}"] = mine[CPU_KEY]
        if CUDA_KEY in mine:
            flat[f"rng/cuda/rank{rank}"] = mine[CUDA_KEY]
    return flat


def of_rank(flat: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """``rank``'s states from ``by_rank``'s file; rank 0's for a rank the run that wrote
    it did not have (it resumes on more ranks)."""
    rank = rank if f"rng/rank{rank}" in flat else 0
    states = {CPU_KEY: flat[f"rng/rank{rank}"]}
    if f"rng/cuda/rank{rank}" in flat:
        states[CUDA_KEY] = flat[f"rng/cuda/rank{rank}"]
    return states
