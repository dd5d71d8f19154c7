"""Byte-level BPE trained with Hugging Face ``tokenizers``.

Byte-level means every string is encodable (no unknown token). Special tokens
take the first ids so they are the same for every vocabulary size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

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
