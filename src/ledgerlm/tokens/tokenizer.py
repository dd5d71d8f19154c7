"""Byte-level BPE trained with Hugging Face ``tokenizers``.

Byte-level means every string is encodable (no unknown token). Special tokens
take the first ids so they are the same for every vocabulary size.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class TokenText:
    """How much text each token id stands for: UTF-8 bytes, and characters (counted at
    their first byte, so a character split over tokens counts once). Special tokens
    stand for none. Losses per byte or per character then compare across tokenizers."""

    bytes: np.ndarray  # int64, one per id
    chars: np.ndarray


def token_text(tok: Tokenizer) -> TokenText:
    """``TokenText`` of a tokenizer: byte-level tokens are read back through the byte
    alphabet; any other token as the UTF-8 of its text."""
    alphabet = _byte_alphabet()
    size = tok.get_vocab_size()
    n_bytes = np.zeros(size, dtype=np.int64)
    n_chars = np.zeros(size, dtype=np.int64)
    special = set(SPECIAL_TOKENS) | {t.content for t in tok.get_added_tokens_decoder().values()}
    for token, i in tok.get_vocab().items():
        if token in special or i >= size:
            continue
        if all(c in alphabet for c in token):
            raw = bytes(alphabet[c] for c in token)
        else:
            raw = token.encode("utf-8")
        n_bytes[i] = len(raw)
        n_chars[i] = sum(1 for b in raw if b & 0xC0 != 0x80)  # not a continuation byte
    return TokenText(n_bytes, n_chars)
