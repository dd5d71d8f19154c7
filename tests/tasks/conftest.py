"""A real tiny BPE and a real tiny model for the tasks tests."""

from __future__ import annotations

import pytest
import torch
from task_fixtures import CFG, CORPUS

from ledgerlm.config import TokenizerConfig
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.tokenizer import special_ids, train_tokenizer


@pytest.fixture(scope="session")
def tok():
    return train_tokenizer(CORPUS * 40, TokenizerConfig(vocab_size=300))


@pytest.fixture(scope="session")
def specials(tok) -> dict[str, int]:
    return special_ids(tok)


@pytest.fixture(scope="session")
def model(tok) -> GPT:
    torch.manual_seed(0)
    return GPT(CFG, tok.get_vocab_size()).eval()


@pytest.fixture(scope="session")
def wild(tok) -> GPT:
    """Weights drawn wide (std 0.3): greedy generations that change token to token,
    where the default's small weights repeat one token."""
    torch.manual_seed(0)
    return GPT(CFG.model_copy(update={"init_std": 0.3}), tok.get_vocab_size()).eval()
