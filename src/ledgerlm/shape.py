"""The sizes a recipe implies, counted without building anything (no torch).

- ``param_count``: N of a ``GPT`` shape as the scaling code counts it (C = 6 N D):
  every weight the forward pass multiplies by, once: the blocks, the final norm and
  the output head (``d_model x vocab``, counted even when it is tied to the embedding),
  not the token-embedding lookup, which costs no FLOPs.
- ``tokens_per_update``: the token positions of one optimizer update.

Here, below every component, so that the sweep plans (``scaling.sweep``), the decoder's
FLOPs (``model.decode``) and a recipe's token budget (``lab.mixture``) count alike.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledgerlm.config import Recipe


def param_count(d_model: int, n_layers: int, vocab_size: int, ffn_mult: float = 8 / 3) -> int:
    """N of a ``GPT`` (see the module): per block q, k, v, o (4 d^2), SwiGLU (3 d h,
    h = ffn_mult d rounded up to 16) and two norms (2 d); the final norm (d); the head
    (d V). Checked against ``GPT`` in the tests."""
    hidden = 16 * math.ceil(ffn_mult * d_model / 16)  # = model.gpt.ffn_hidden
    block = 4 * d_model * d_model + 3 * d_model * hidden + 2 * d_model
    return n_layers * block + d_model + d_model * vocab_size


def tokens_per_update(recipe: Recipe, ranks: int = 1) -> int:
    """Training (input) tokens of one optimizer update: every rank's micro-batches
    (``micro_batch_rows x grad_accum x seq_len`` each)."""
    t = recipe.train
    return ranks * t.grad_accum * t.micro_batch_rows * recipe.pack.seq_len
