"""Text into tokens as lm-evaluation-harness cuts a context and its continuation.

``_encode_pair`` (harness 0.4): the context's trailing whitespace moves to the
continuation (so " Paris" is scored as the word it is, not a lone space and "Paris"),
``context + continuation`` is encoded whole and the context alone, and the
continuation's tokens are the whole's after as many tokens as the context alone has.
Where a merge spans the boundary that count decides which side the token falls on, as
in the harness; scoring in process and through the harness therefore reads the same
tokens. It may leave the continuation without a token of its own ("hel" + "lo"): such
an item is refused (``tasks.score.no_tokens_of_its_own``), as the harness refuses it,
since a continuation scored on no tokens would have probability 1.
"""

from __future__ import annotations

from tokenizers import Tokenizer


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s token ids, no special tokens added (BOS is the scorer's)."""
    return tokenizer.encode(text, add_special_tokens=False).ids


def split_pair(context: str, continuation: str) -> tuple[str, str]:
    """The context's trailing whitespace moved to the continuation."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def encode_pair(
    tokenizer: Tokenizer, context: str, continuation: str
) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) of a pair (module doc)."""
    context, continuation = split_pair(context, continuation)
    whole = encode(tokenizer, context + continuation)
    n = len(encode(tokenizer, context))
    return whole[:n], whole[n:]
