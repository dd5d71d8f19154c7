"""Bits per byte: each token id's UTF-8 bytes and characters, and evaluations that give
bits per byte and nats per character of the same targets as the loss."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerlm.config import EvalConfig, TokenizerConfig, load_recipe
from ledgerlm.tokens.tokenizer import token_text, train_tokenizer
from ledgerlm.train.evaluate import EvalCallback

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


def test_an_evaluation_gives_bits_per_byte_of_the_same_targets(tiny_run):
    from ledgerlm.lab.build import val_batches
    from ledgerlm.ledger.store import Ledger
    from ledgerlm.tokens.shards import TokenStore

    ws, recipe = tiny_run
    with Ledger(ws / "ledger.db") as ledger:
        summary = ledger.run_summary(ledger.resolve_run("latest"))
    store = TokenStore(next((ws / "tokens").iterdir()))
    val = val_batches(store, recipe)
    ids = np.concatenate([b.targets[b.loss_mask].numpy() for b in val])
    n_bytes, n_chars = store.text.bytes[ids].sum(), store.text.chars[ids].sum()
    metrics = summary["evaluations"][-1]["metrics"]
    nats = metrics["loss"] * len(ids)
    assert metrics["bpb"] == pytest.approx(nats / n_bytes / math.log(2), rel=1e-9)
    assert metrics["nats_per_char"] == pytest.approx(nats / n_chars, rel=1e-9)
    assert {k for k in metrics if k.startswith("bpb/")} == {f"bpb/{d}" for d in store.domains}
    assert json.dumps(metrics)  # all finite, JSON-able


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from cli_runner import TINY, ledgerlm

    ws = tmp_path_factory.mktemp("bpb")
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=4",
             "--set", "eval.every_steps=2")  # fmt: skip
    return ws, load_recipe(TINY)


def test_the_report_and_ledger_show_give_bits_per_byte(tiny_run, tmp_path):
    from cli_runner import ledgerlm

    ws, _ = tiny_run
    page = tmp_path / "r.html"
    ledgerlm("report", "latest", "-w", str(ws), "-o", str(page))
    assert "bits per byte" in page.read_text()
    shown = ledgerlm("ledger", "show", "latest", "-w", str(ws)).stdout.splitlines()
    header = next(line for line in shown if line.lstrip().startswith("step") and "loss" in line)
    assert "bpb" in header.split()
