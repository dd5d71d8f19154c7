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

    from ledgerlm.train.checkpoint import _MetadataUnpickler

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="may not name"):
        _MetadataUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    fine = pickle.dumps((torch.Size([2, 3]), torch.float32))
    assert _MetadataUnpickler(io.BytesIO(fine)).load() == (torch.Size([2, 3]), torch.float32)
