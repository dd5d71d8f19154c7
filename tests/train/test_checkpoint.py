import io

import pytest
import torch

from ledgerlm.config import ModelConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.train.checkpoint import WEIGHTS, load_checkpoint, save_checkpoint
from ledgerlm.train.evaluate import weights_digest

CFG = ModelConfig(d_model=16, n_layers=1, n_heads=2)


def test_round_trip_restores_identical_weights(tmp_path):
    torch.manual_seed(0)
    model = GPT(CFG, 30)
    save_checkpoint(tmp_path / "ckpt", model, {"step": 7})
    torch.manual_seed(1)
    other = GPT(CFG, 30)
    assert weights_digest(other) != weights_digest(model)
    state = load_checkpoint(tmp_path / "ckpt", other)
    assert state["step"] == 7
    assert weights_digest(other) == weights_digest(model)
    assert other.lm_head.weight is other.embed.weight  # tying survives loading
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary left


def test_corrupted_weights_are_refused(tmp_path):
    model = GPT(CFG, 30)
    folder = save_checkpoint(tmp_path / "ckpt", model, {})
    data = bytearray((folder / WEIGHTS).read_bytes())
    data[-1] ^= 0xFF
    (folder / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_checkpoint(folder, GPT(CFG, 30))


def test_dcp_metadata_is_read_without_running_code():
    """A DCP ``.metadata`` file is a pickle: the loader accepts DCP's own classes and
    refuses anything else a tampered file could name."""
    import os
    import pickle

    from ledgerlm.train.dcp_reading import MetadataUnpickler

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="may not name"):
        MetadataUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    fine = pickle.dumps((torch.Size([2, 3]), torch.float32))
    assert MetadataUnpickler(io.BytesIO(fine)).load() == (torch.Size([2, 3]), torch.float32)


def _draws() -> torch.Tensor:
    return torch.rand(4)


def test_a_cpu_checkpoint_keeps_the_cpu_generator_and_no_cuda_state(tmp_path):
    from safetensors.torch import load_file

    from ledgerlm.train.checkpoint import TENSORS
    from ledgerlm.train.rng import CPU_KEY, CUDA_KEY

    model = GPT(CFG, 30)
    torch.manual_seed(3)
    folder = save_checkpoint(tmp_path / "ckpt", model, {})
    expected = _draws()
    saved = load_file(str(folder / TENSORS))
    assert CPU_KEY in saved and CUDA_KEY not in saved  # the file a CPU run always wrote
    torch.manual_seed(4)
    load_checkpoint(folder, model, restore_rng=True)
    assert torch.equal(_draws(), expected)


def test_a_checkpoint_with_cuda_state_resumes_on_the_cpu(tmp_path, monkeypatch):
    """Written on a GPU (its generator state saved beside the CPU's), resumed on the
    CPU: the CPU generator is restored, the CUDA state has nowhere to go and is left."""
    from ledgerlm.train import checkpoint, rng

    def with_cuda(device):  # what a CUDA run saves, made on the CPU
        return {**rng.generator_states(device), rng.CUDA_KEY: torch.zeros(16, dtype=torch.uint8)}

    monkeypatch.setattr(checkpoint, "generator_states", with_cuda)
    put = []  # on a CPU build torch would queue the call for a CUDA that never comes
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *args: put.append(args))
    model = GPT(CFG, 30)
    torch.manual_seed(5)
    folder = save_checkpoint(tmp_path / "ckpt", model, {})
    expected = _draws()
    torch.manual_seed(6)
    load_checkpoint(folder, model, restore_rng=True)
    assert torch.equal(_draws(), expected)
    assert put == []


def test_each_rank_finds_its_generators_and_a_new_rank_takes_rank_0s():
    from ledgerlm.train.rng import CPU_KEY, CUDA_KEY, by_rank, of_rank

    a, b, c = (torch.full((3,), i, dtype=torch.uint8) for i in range(3))
    flat = by_rank([{CPU_KEY: a, CUDA_KEY: c}, {CPU_KEY: b}])
    assert sorted(flat) == ["rng/cuda/rank0", "rng/rank0", "rng/rank1"]
    assert of_rank(flat, 1) == {CPU_KEY: b}
    assert of_rank(flat, 0) == {CPU_KEY: a, CUDA_KEY: c}
    assert of_rank(flat, 5) == {CPU_KEY: a, CUDA_KEY: c}  # resumed on more ranks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the GPU's generator")
def test_a_cuda_checkpoint_restores_the_gpus_generator(tmp_path):
    from safetensors.torch import load_file

    from ledgerlm.train.checkpoint import TENSORS
    from ledgerlm.train.rng import CUDA_KEY

    model = GPT(CFG, 30).to("cuda")
    torch.manual_seed(7)
    folder = save_checkpoint(tmp_path / "ckpt", model, {})
    assert CUDA_KEY in load_file(str(folder / TENSORS))
    expected = torch.rand(4, device="cuda"), _draws()
    torch.manual_seed(8)
    load_checkpoint(folder, model, restore_rng=True)
    assert torch.equal(torch.rand(4, device="cuda"), expected[0])
    assert torch.equal(_draws(), expected[1])
