"""Export a trained ``GPT`` as a Hugging Face ``LlamaForCausalLM`` folder.

ledgerlm's decoder is Llama without biases, so the export is a renaming of
tensors plus a ``LlamaConfig``. RoPE needs no permutation: ``apply_rope`` rotates
(first half, second half) pairs of each head with frequencies
``theta ** (-2i / head_dim)``, which is exactly HF's ``rotate_half`` layout with
``cos``/``sin`` tiled as ``cat(freqs, freqs)``. (The q/k permutation in Meta's
converter exists only because the original Llama rotates *interleaved* pairs.)

The folder is written in a hidden temporary sibling and renamed into place, so a
reader never sees half an export.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ledgerlm.extras import require
from ledgerlm.model.gpt import GPT, ffn_hidden

WEIGHTS = "model.safetensors"


class ExportError(ValueError):
    """An export that cannot be done; the message is one line naming the problem."""


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """ledgerlm parameter names -> HF Llama names; ``lm_head`` is left out when tied."""
    sd = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    pairs = {
        "attn.wq": "self_attn.q_proj",
        "attn.wk": "self_attn.k_proj",
        "attn.wv": "self_attn.v_proj",
        "attn.wo": "self_attn.o_proj",
        "mlp.w_gate": "mlp.gate_proj",
        "mlp.w_up": "mlp.up_proj",
        "mlp.w_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "mlp_norm": "post_attention_layernorm",
    }
    for i in range(model.cfg.n_layers):
        for ours, theirs in pairs.items():
            out[f"model.layers.{i}.{theirs}.weight"] = sd[f"blocks.{i}.{ours}.weight"]
    if not model.cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"].clone()  # its own storage for safetensors
    return out


def llama_config(model: GPT, special: dict[str, int] | None, max_positions: int):
    """The ``LlamaConfig`` equivalent of ``model`` for the installed transformers."""
    LlamaConfig = require("transformers", "the Hugging Face export").LlamaConfig

    cfg = model.cfg
    theta = float(cfg.rope_theta)
    # transformers 5 keeps RoPE settings in `rope_parameters`; 4.x reads a top-level `rope_theta`.
    v5 = "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters
    rope: dict[str, Any] = (
        {"rope_parameters": {"rope_type": "default", "rope_theta": theta}}
        if v5
        else {"rope_theta": theta}
    )
    special = special or {}
    hf = LlamaConfig(
        vocab_size=model.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=ffn_hidden(cfg),
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        head_dim=cfg.d_model // cfg.n_heads,
        hidden_act="silu",
        max_position_embeddings=max_positions,
        initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=special.get("bos"),
        eos_token_id=special.get("eos"),
        pad_token_id=special.get("pad"),
        **rope,
    )
    hf.architectures = ["LlamaForCausalLM"]
    # Written as "dtype" by transformers 5 (which deprecates the old "torch_dtype").
    setattr(hf, "dtype" if v5 else "torch_dtype", "float32")
    got = getattr(hf, "rope_parameters", None) or {}
    if float(got.get("rope_theta", getattr(hf, "rope_theta", theta))) != theta:
        raise ExportError(f"LlamaConfig did not keep rope_theta={theta}")
    return hf


def _write_tokenizer(folder: Path, tokenizer_path: Path, special: dict[str, int], n: int) -> None:
    """The training tokenizer, set to put BOS before a text as training did (every
    document was packed as BOS + ids + EOS), with its special tokens named for
    ``PreTrainedTokenizerFast``. Encoding is otherwise exactly the training one.
    """
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(tokenizer_path))
    if "bos" in special:
        bos = tok.id_to_token(special["bos"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, special["bos"])]
        )
    tok.save(str(folder / "tokenizer.json"))
    names = {f"{k}_token": tok.id_to_token(i) for k, i in special.items()}
    conf = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": n,
        "clean_up_tokenization_spaces": False,
        **names,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(conf, indent=2) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n")


def _readable(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; an export is meant to be shared like any output."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def check_target(out_dir: Path, force: bool) -> None:
    """Refuse a target that is a file, or a folder with files in it unless ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ExportError(f"{out_dir}: folder is not empty (use --force to replace it)")


def export_hf(
    model: GPT,
    out_dir: Path,
    *,
    tokenizer_path: Path | None,
    special: dict[str, int] | None,
    max_positions: int,
    force: bool = False,
) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer into ``out_dir``."""
    out_dir = Path(out_dir)
    check_target(out_dir, force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        llama_config(model, special, max_positions).save_pretrained(tmp)
        save_file(hf_state_dict(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        if tokenizer_path is not None:
            _write_tokenizer(tmp, Path(tokenizer_path), special or {}, max_positions)
        _readable(tmp)
        check_target(out_dir, force)  # again: something may have appeared meanwhile
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
