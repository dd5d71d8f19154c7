"""Byte-level BPE trained with Hugging Face ``tokenizers``.

Byte-level means every string is encodable (no unknown token). Special tokens
take the first ids so they are the same for every vocabulary size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ledgerlm.config import TokenizerConfig

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = [PAD, BOS, EOS]


def _capped(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    used = 0
    for text in texts:
        if used >= max_chars:
            return
        piece = text[: max_chars - used]
        used += len(piece)
        yield piece


def train_tokenizer(texts: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    """Learn merges from at most ``cfg.max_train_chars`` characters of ``texts``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_capped(texts, cfg.max_train_chars), trainer=trainer)
    return tok


def load_tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    missing = [n for n, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}")
    return {"pad": ids[PAD], "bos": ids[BOS], "eos": ids[EOS]}


# Names a supplied tokenizer's special tokens commonly have, most specific first.
_CANDIDATES = {
    "bos": (BOS, "<s>", "<|begin_of_text|>", "[CLS]", "<|endoftext|>"),
    "eos": (EOS, "</s>", "<|end_of_text|>", "<|eot_id|>", "[SEP]", "<|endoftext|>"),
    "pad": (PAD, "<|pad|>", "[PAD]"),
}


@dataclass(frozen=True)
class Supplied:
    """A tokenizer read from disk: the tokenizer, the file it came from, and its BOS,
    EOS and padding ids (padding falls back to EOS: padded positions are never trained)."""

    tokenizer: Tokenizer
    path: Path
    special: dict[str, int]


def load_supplied(where: str | Path, names: dict[str, str | None] | None = None) -> Supplied:
    """A ``tokenizer.json`` file, or a local Hugging Face tokenizer folder (its
    ``tokenizer.json``; special tokens from its ``tokenizer_config.json`` when named
    there). ``names`` (bos, eos, pad) override; otherwise each is found by its usual
    names. Nothing is downloaded."""
    path = Path(where)
    file = tokenizer_file(path)
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises its own Exception type
        raise ValueError(f"{file}: not a tokenizers JSON file: {err}") from None
    declared = _declared_specials(path / "tokenizer_config.json") if path.is_dir() else {}
    special: dict[str, int] = {}
    for kind in ("bos", "eos", "pad"):
        asked = (names or {}).get(kind) or declared.get(kind)
        if asked is not None:
            i = tok.token_to_id(asked)
            if i is None:
                raise ValueError(f"{file}: no token {asked!r} for {kind}")
            special[kind] = i
            continue
        found = next(
            (tok.token_to_id(n) for n in _CANDIDATES[kind] if tok.token_to_id(n) is not None), None
        )
        if found is not None:
            special[kind] = found
    if "eos" not in special:
        raise ValueError(f'{file}: no EOS token found by name; name it with tokenizer.eos = "..."')
    special.setdefault("bos", special["eos"])
    special.setdefault("pad", special["eos"])
    return Supplied(tok, file, special)


def tokenizer_file(where: str | Path) -> Path:
    """The ``tokenizer.json`` that ``tokenizer.from`` names (the file itself, or the one
    in a folder); one clear error when there is none. Nothing is read."""
    path = Path(where)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"tokenizer.from = {str(where)!r}: no tokenizer.json there (give the file or a "
            "folder that holds one; nothing is downloaded)"
        )
    return file


def _declared_specials(config: Path) -> dict[str, str]:
    """bos/eos/pad tokens a Hugging Face ``tokenizer_config.json`` names, if any."""
    if not config.is_file():
        return {}
    try:
        conf = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for kind in ("bos", "eos", "pad"):
        value = conf.get(f"{kind}_token")
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        if isinstance(value, str) and value:
            out[kind] = value
    return out


def _byte_alphabet() -> dict[str, int]:
    """The byte-level alphabet: the character that stands for each byte 0-255 in a
    byte-level BPE token (printable Latin-1 bytes stand for themselves, the others are
    shifted past 255), mapped back to the byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, shift = {}, 0
    for b in range(256):
        if b in kept:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shift)] = b
            shift += 1
    return chars


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True)
class TokenText:
    """How much text each token id stands for: UTF-8 bytes, and characters (counted at
    their first byte, so a character split over tokens counts once). Special tokens
    stand for none. Losses per byte or per character then compare across tokenizers."""

    bytes: np.ndarray  # int64, one per id
    chars: np.ndarray


def _uses_byte_level(spec: object) -> bool:
    """Whether a tokenizer's JSON uses byte-level pre-tokenization or decoding anywhere."""
    if isinstance(spec, dict):
        if spec.get("type") == "ByteLevel":
            return True
        return any(
            _uses_byte_level(spec.get(k))
            for k in ("pre_tokenizer", "decoder", "pretokenizers", "decoders")
        )
    if isinstance(spec, list):
        return any(_uses_byte_level(x) for x in spec)
    return False


def token_text(tok: Tokenizer) -> TokenText:
    """``TokenText`` of a tokenizer: a byte-level tokenizer's tokens are read back
    through the byte alphabet; SentencePiece byte tokens (``<0x0A>``) are one byte; any
    other token is the UTF-8 of its text, its word-start mark a space."""
    alphabet = _byte_alphabet()
    byte_level = _uses_byte_level(json.loads(tok.to_str()))
    size = tok.get_vocab_size()
    n_bytes = np.zeros(size, dtype=np.int64)
    n_chars = np.zeros(size, dtype=np.int64)
    added = tok.get_added_tokens_decoder().values()
    special = set(SPECIAL_TOKENS) | {t.content for t in added if t.special}
    for token, i in tok.get_vocab().items():
        if token in special or i >= size:
            continue
        if byte_level and all(c in alphabet for c in token):
            raw = bytes(alphabet[c] for c in token)
        elif _BYTE_TOKEN.fullmatch(token):  # SentencePiece byte fallback: <0x0A>
            raw = bytes([int(token[3:5], 16)])
        else:  # SentencePiece's word-start mark stands for a space
            raw = token.replace("\u2581", " ").encode("utf-8")
        n_bytes[i] = len(raw)
        n_chars[i] = sum(1 for b in raw if b & 0xC0 != 0x80)  # not a continuation byte
    return TokenText(n_bytes, n_chars)
