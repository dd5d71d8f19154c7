"""Context and continuation cut into tokens as lm-evaluation-harness's ``_encode_pair``
cuts them, on a real byte-level BPE."""

from __future__ import annotations

from ledgerlm.tasks.encoding import encode, encode_pair, split_pair


def test_trailing_whitespace_of_the_context_moves_to_the_continuation():
    assert split_pair("on the  \n", "mat") == ("on the", "  \nmat")
    assert split_pair("on the", " mat") == ("on the", " mat")
    assert split_pair("", "mat") == ("", "mat")


def test_a_trailing_space_is_scored_with_the_word_it_starts(tok):
    ctx, cont = encode_pair(tok, "the cat sat on the ", "mat")
    assert (ctx, cont) == encode_pair(tok, "the cat sat on the", " mat")
    assert tok.decode(cont) == " mat" and len(cont) == 1  # the merged word " mat"
    # encoded apart, the context would end in a lone space and "mat" would be scored alone
    naive = encode(tok, "the cat sat on the "), encode(tok, "mat")
    assert naive[0][-1] == tok.token_to_id("Ġ") and naive[1] != cont


def test_continuation_tokens_are_the_whole_after_the_contexts_count(tok):
    whole = encode(tok, "12 + 30 = 42")
    ctx, cont = encode_pair(tok, "12 + 30 =", " 42")
    assert ctx + cont == whole and len(ctx) == len(encode(tok, "12 + 30 ="))
    # where a merge spans the boundary, the count decides: "1" + "2" encodes as one token
    # "12", so the context "1" takes it and the continuation has no token of its own
    assert encode(tok, "12") == [tok.token_to_id("12")]
    assert encode_pair(tok, "1", "2") == ([tok.token_to_id("12")], [])
