"""The HF Llama export computes the same function as the ledgerlm model it came from."""

import json

import pytest
import torch

from ledgerlm.config import ModelConfig
from ledgerlm.model.attention import attention_mask
from ledgerlm.model.export import ExportError, export_hf
from ledgerlm.model.gpt import GPT

transformers = pytest.importorskip("transformers")

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4, rope_theta=500.0, norm_eps=1e-6)
V = 50
SPECIAL = {"pad": 0, "bos": 1, "eos": 2}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _model(tied: bool, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CFG.model_copy(update={"tie_embeddings": tied}), V)
    with torch.no_grad():  # norm weights away from 1, so a swapped or missing norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return model.eval()


def _ours(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        return model(ids, pos, attention_mask(torch.zeros_like(ids), "isolated"))


@pytest.mark.parametrize("tied", [True, False])
def test_hf_llama_logits_match(tmp_path, tied):
    model = _model(tied)
    out = export_hf(model, tmp_path / "hf", tokenizer_path=None, special=SPECIAL, max_positions=64)
    hf = transformers.LlamaForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert hf.config.tie_word_embeddings is tied
    assert hf.config.intermediate_size == model.blocks[0].mlp.w_gate.out_features
    ids = torch.randint(0, V, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    assert (theirs - _ours(model, ids)).abs().max().item() < 1e-4


def test_export_files_and_config(tmp_path):
    out = export_hf(
        _model(False), tmp_path / "hf", tokenizer_path=None, special=SPECIAL, max_positions=128
    )
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors"}
    conf = json.loads((out / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLM"]
    assert conf["max_position_embeddings"] == 128
    assert (conf["bos_token_id"], conf["eos_token_id"], conf["pad_token_id"]) == (1, 2, 0)
    theta = conf.get("rope_parameters", {}).get("rope_theta", conf.get("rope_theta"))
    assert theta == 500.0 and conf["rms_norm_eps"] == 1e-6
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp folder left


def test_refuses_a_non_empty_folder_unless_forced(tmp_path):
    target = tmp_path / "hf"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    kw = {"tokenizer_path": None, "special": None, "max_positions": 16}
    with pytest.raises(ExportError, match="not empty"):
        export_hf(_model(True), target, **kw)
    assert (target / "keep.txt").read_text() == "mine"
    export_hf(_model(True), target, force=True, **kw)
    assert not (target / "keep.txt").exists() and (target / "config.json").is_file()
