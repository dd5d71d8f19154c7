"""Bits per byte: each token id's UTF-8 bytes and characters, and evaluations that give
bits per byte and nats per character of the same targets as the loss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from finite import assert_finite
from ledgerlm.config import EvalConfig, ModelConfig, TokenizerConfig, load_recipe
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import make_batch
from ledgerlm.tokens.tokenizer import special_ids, token_text, train_tokenizer
from ledgerlm.train.evaluate import EvalCallback, evaluate

CORPUS = [
    "def area(r):\n    return 3.14159 * r ** 2\n",
    "Naïve café owners in Zürich serve crème brûlée.",
    "東京と大阪の間の距離は約五百キロです。",
    "Emoji 🙂 and symbols ∑ ∫ ≤ ≥ travel as several bytes.",
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, TokenizerConfig(vocab_size=400, min_frequency=1))


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=80))
def test_token_bytes_and_chars_add_up_to_the_text(tok, text):
    t = token_text(tok)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert int(t.bytes[ids].sum()) == len(text.encode("utf-8"))
    assert int(t.chars[ids].sum()) == len(text)


def test_special_tokens_stand_for_no_text(tok):
    t = token_text(tok)
    for name in ("<pad>", "<bos>", "<eos>"):
        i = tok.token_to_id(name)
        assert t.bytes[i] == 0 and t.chars[i] == 0


def test_the_target_in_bits_per_byte():
    assert EvalConfig().target() == ("loss", 4.0, "nat/token")
    cfg = EvalConfig(target_bpb=1.25, metric="loss/code")
    assert cfg.target() == ("bpb/code", 1.25, "bit/byte")
    assert cfg.contract()["unit"] == "bit/byte" and cfg.contract()["threshold"] == 1.25
    evaluator = EvalCallback([], cfg, "isolated", ["code"])
    evaluator.observe({"step": 10, "metrics": {"loss/code": 0.1, "bpb/code": 1.3}}, None)
    assert evaluator.reached_step is None  # the loss is low, but the target is in bpb
    evaluator.observe({"step": 20, "metrics": {"loss/code": 0.1, "bpb/code": 1.25}}, None)
    assert evaluator.reached_step == 20


# Held-out documents of four domains, each kind of text CORPUS has (1 to 4 bytes a
# character), two a domain.
VAL = {
    "code": ["def volume(r, h):\n    return area(r) * h\n", "print(area(2.5))\n"],
    "prose": ["Zürich's naïve café owners.", "Crème brûlée travels well."],
    "cjk": ["大阪と東京の間です。", "約五百キロの距離"],
    "symbols": ["∑ ≤ ∫ 🙂 as bytes", "🙂🙂 ≥ ∫"],
}


def _packed_batches(tok, docs: list[tuple[str, int]]) -> list:
    """Two documents a row (BOS + ids + EOS each, padding after), two rows a batch."""
    sp = special_ids(tok)
    wrapped = [
        ([sp["bos"], *tok.encode(text, add_special_tokens=False).ids, sp["eos"]], d)
        for text, d in docs
    ]
    rows = [wrapped[i : i + 2] for i in range(0, len(wrapped), 2)]
    width = max(sum(len(t) for t, _ in row) for row in rows) + 1
    tokens = np.full((len(rows), width), sp["pad"])
    segments, domains = np.full_like(tokens, -1), np.full_like(tokens, -1)
    for r, row in enumerate(rows):
        at = 0
        for k, (toks, d) in enumerate(row):
            span = slice(at, at + len(toks))
            tokens[r, span], segments[r, span], domains[r, span] = toks, 2 * r + k, d
            at += len(toks)
    valid = segments >= 0
    return [
        make_batch(tokens[i : i + 2], segments[i : i + 2], valid[i : i + 2], domains[i : i + 2])
        for i in range(0, len(rows), 2)
    ]


@torch.no_grad()
def _document_nats(model: GPT, tok, text: str) -> float:
    """-ln p of a document's ids and its EOS, each after BOS and the ids before it: one
    forward of the document alone, under a plain causal mask."""
    sp = special_ids(tok)
    ids = tok.encode(text, add_special_tokens=False).ids
    inputs, targets = torch.tensor([[sp["bos"], *ids]]), torch.tensor([*ids, sp["eos"]])
    t = inputs.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    logits = model(inputs, torch.arange(t)[None], causal)[0].double()
    return float(F.cross_entropy(logits, targets, reduction="sum"))


def test_bits_per_byte_per_domain_are_the_documents_nats_over_their_utf8_bytes(tok):
    names = list(VAL)
    # interleaved, so rows mix domains: code, prose, cjk, symbols, code, ...
    docs = [(text, d) for pair in zip(*VAL.values(), strict=True) for d, text in enumerate(pair)]
    torch.manual_seed(0)
    # a wide init: the targets' losses differ, so a loss put to the wrong domain shows
    model = GPT(ModelConfig(d_model=32, n_layers=2, n_heads=2, init_std=0.5), 400).eval()
    metrics = evaluate(model, _packed_batches(tok, docs), "isolated", names, text=token_text(tok))

    # nats from a forward of each document alone; bytes and characters from the text
    nats = {d: sum(_document_nats(model, tok, text) for text in VAL[d]) for d in names}
    n_bytes = {d: sum(len(text.encode("utf-8")) for text in VAL[d]) for d in names}
    n_chars = sum(len(text) for texts in VAL.values() for text in texts)
    expected = {d: nats[d] / (math.log(2) * n_bytes[d]) for d in names}
    assert len(set(np.round(list(expected.values()), 2))) == 4  # four different figures
    # the packed forward and the one-document forwards are the same fp32 arithmetic but
    # for the masked (zero-weight) keys and the summation order: a few ulps per logit
    # (4e-8 relative measured); a target or a byte more or less would be over 1e-2
    for d in names:
        assert metrics[f"bpb/{d}"] == pytest.approx(expected[d], rel=1e-6), d
    total_nats, total_bytes = sum(nats.values()), sum(n_bytes.values())
    assert metrics["bpb"] == pytest.approx(total_nats / (math.log(2) * total_bytes), rel=1e-6)
    assert metrics["nats_per_char"] == pytest.approx(total_nats / n_chars, rel=1e-6)
    assert_finite(metrics)


def test_an_evaluation_gives_bits_per_byte_of_the_same_targets(tiny_run):
    from ledgerlm.lab.build import val_batches
    from ledgerlm.ledger.store import Ledger
    from ledgerlm.tokens.shards import TokenStore

    ws, recipe, run = tiny_run
    with Ledger(ws / "ledger.db") as ledger:
        summary = ledger.run_summary(run)
    store = TokenStore(next((ws / "tokens").iterdir()))
    val = val_batches(store, recipe)
    ids = np.concatenate([b.targets[b.loss_mask].numpy() for b in val])
    n_bytes, n_chars = store.text.bytes[ids].sum(), store.text.chars[ids].sum()
    metrics = summary["evaluations"][-1]["metrics"]
    nats = metrics["loss"] * len(ids)
    assert metrics["bpb"] == pytest.approx(nats / n_bytes / math.log(2), rel=1e-9)
    assert metrics["nats_per_char"] == pytest.approx(nats / n_chars, rel=1e-9)
    assert {k for k in metrics if k.startswith("bpb/")} == {f"bpb/{d}" for d in store.domains}
    assert_finite(metrics)
    json.dumps(metrics, allow_nan=False)  # strict JSON: a NaN or an infinity raises


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from cli_runner import TINY, ledgerlm

    ws = tmp_path_factory.mktemp("bpb")
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=4",
             "--set", "eval.every_steps=2")  # fmt: skip
    (run_dir,) = (ws / "runs").iterdir()
    return ws, load_recipe(TINY), run_dir.name  # the workspace, its recipe, the run's id


def test_the_report_and_ledger_show_give_bits_per_byte(tiny_run, tmp_path):
    from cli_runner import ledgerlm

    ws, _, run = tiny_run
    page = tmp_path / "r.html"
    ledgerlm("report", run, "-w", str(ws), "-o", str(page))
    assert "bits per byte" in page.read_text()
    shown = ledgerlm("ledger", "show", run, "-w", str(ws)).stdout.splitlines()
    header = next(line for line in shown if line.lstrip().startswith("step") and "loss" in line)
    assert "bpb" in header.split()
