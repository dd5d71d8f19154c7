"""A supplied tokenizer (a tokenizer.json file or a local Hugging Face folder): its
special tokens found or named, its text sizes exact for bits per byte, and a run that
trains with it end to end. Tokenizers are built here; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from cli_runner import TINY, ledgerlm
from ledgerlm.tokens.tokenizer import load_supplied, token_text

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The ledger keeps every second of a run in a phase.",
    "Überall gibt es Zeichen wie é, ø und 東京.",
] * 30


def _sentencepiece_like(folder: Path) -> Path:
    """A Llama-style tokenizer: Metaspace word starts, <0xNN> byte fallback for any
    character it lacks, <s> and </s> (a vocabulary of single characters, no merges)."""
    chars = sorted({c for t in TEXTS for c in t.replace(" ", "\u2581")} | {"\u2581"})
    names = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *chars]
    tok = Tokenizer(
        models.BPE({n: i for i, n in enumerate(names)}, [], unk_token="<unk>", byte_fallback=True)
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    conf = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "tokenizer_class": "X"}
    (folder / "tokenizer_config.json").write_text(json.dumps(conf))
    return folder


def _gpt2_like(path: Path) -> Path:
    """A GPT-2-style tokenizer: byte-level, one <|endoftext|> token for everything."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS, trainer=trainer)
    tok.save(str(path))
    return path


def test_special_tokens_from_the_folder_by_name_or_as_named(tmp_path):
    sp = load_supplied(_sentencepiece_like(tmp_path / "sp"))
    tok = sp.tokenizer
    assert sp.special == {
        "bos": tok.token_to_id("<s>"),
        "eos": tok.token_to_id("</s>"),
        "pad": tok.token_to_id("</s>"),  # no padding token: EOS (padding is never trained)
    }
    gpt = load_supplied(_gpt2_like(tmp_path / "gpt2.json"))
    eot = gpt.tokenizer.token_to_id("<|endoftext|>")
    assert gpt.special == {"bos": eot, "eos": eot, "pad": eot}
    named = load_supplied(tmp_path / "sp", {"bos": "</s>", "eos": "<s>", "pad": None})
    assert named.special["bos"] == tok.token_to_id("</s>")
    with pytest.raises(ValueError, match="no token '<nope>' for eos"):
        load_supplied(tmp_path / "sp", {"eos": "<nope>"})
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json there"):
        load_supplied(tmp_path / "missing")


@pytest.mark.parametrize("kind", ["sentencepiece", "gpt2"])
def test_text_sizes_are_exact_for_other_tokenizers(tmp_path, kind):
    where = (
        _sentencepiece_like(tmp_path / "sp")
        if kind == "sentencepiece"
        else _gpt2_like(tmp_path / "g.json")
    )
    tok = load_supplied(where).tokenizer
    sizes = token_text(tok)
    # A Metaspace tokenizer marks the start of a text as a word start: one space more
    # than the text holds, one byte per document (its decoder drops it again).
    extra = 1 if kind == "sentencepiece" else 0
    for text in ["plain words here", "Zeichen é ø 東京 and a tab\there", "🙂 not in training"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids)
        assert int(sizes.bytes[ids].sum()) == len(decoded.encode("utf-8")) + extra, text
        assert int(sizes.chars[ids].sum()) == len(decoded) + extra


def test_a_run_with_a_supplied_tokenizer(tmp_path):
    folder = _sentencepiece_like(tmp_path / "tok")
    ws = tmp_path / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", f'tokenizer.from="{folder}"',
             "--set", "train.max_steps=4", "--set", "eval.every_steps=2")  # fmt: skip
    (tokens,) = (ws / "tokens").iterdir()
    manifest = json.loads((tokens / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert manifest["tokenizer"]["vocab_size"] == tok.get_vocab_size()
    assert manifest["tokenizer"]["special"]["bos"] == tok.token_to_id("<s>")
    assert manifest["tokenizer"]["trained_on"].startswith("supplied: ")
    missing = ledgerlm("run", str(TINY), "-w", str(tmp_path / "w2"),
                       "--set", 'tokenizer.from="nowhere/"', check=False)  # fmt: skip
    assert missing.returncode == 2 and "no tokenizer.json there" in missing.stderr
    assert not (tmp_path / "w2").exists()  # stopped before anything was written
