"""ledgerlm's ``choice`` scoring and lm-evaluation-harness's ``multiple_choice`` agree
item by item on the same items and the same trained weights: each item's
log-likelihood per choice (to float32 tolerance), its acc and acc_norm prediction, and
so every metric key. The items are 50 next-line questions on a standard-library file,
their contexts ending in spaces, tabs, newlines or nothing, and their choices starting
with spaces or not, so the harness's tokenization rule (a context's trailing whitespace
moved into the continuation, the continuation's tokens read off the pair encoded whole)
decides what many of them score; a one-shot prompt makes the contexts long enough that
some are cut from the left at the model's context."""

from __future__ import annotations

import inspect
import json
import random
import textwrap

import numpy as np
import pytest

from ledgerlm.config import TaskConfig
from ledgerlm.lab.export import load_run_model
from ledgerlm.lab.harness import HarnessError, run_harness
from ledgerlm.model.export import export_hf
from ledgerlm.tasks.encoding import encode, encode_pair
from ledgerlm.tasks.items import load_task
from ledgerlm.tasks.score import score_task
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.workspace import Workspace

pytestmark = pytest.mark.slow  # the harness's start in a process of its own is most of it
ENDS = ["", " ", "  ", "\n", "\t", " \n", "\n\n"]
LEADS = ["", " ", "  ", "\n"]


def _items(n: int, pool: int) -> list[dict]:
    """``pool`` few-shot records, then ``n`` next-line questions on textwrap.py: the true
    next line against two lines from elsewhere, whitespace varied at every edge."""
    lines = [ln.strip() for ln in inspect.getsource(textwrap).splitlines() if len(ln.strip()) > 8]
    rng = random.Random(0)
    out = []
    for i in range(n + pool):
        at = rng.randrange(len(lines) - 1)
        others = rng.sample([ln for ln in lines if ln != lines[at + 1]], 2)
        choices = [rng.choice(LEADS) + c for c in (lines[at + 1], *others)]
        gold = rng.randrange(3)
        choices[0], choices[gold] = choices[gold], choices[0]
        record = {"context": lines[at] + ENDS[i % len(ENDS)], "choices": choices, "gold": gold}
        out.append({**record, "split": "train"} if i < pool else record)
    return out


def test_choice_acc_and_acc_norm_equal_the_harness_item_by_item(
    tiny_workspace, tiny_run_id, tmp_path
):
    pytest.importorskip(
        "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'ledgerlm[lmeval]'"
    )
    ws = Workspace(tiny_workspace)
    loaded = load_run_model(ws, tiny_run_id)
    model = loaded.model.eval()
    seq_len = loaded.recipe.pack.seq_len
    store = TokenStore(ws.version_dir("tokens", loaded.tokens_version))
    path = tmp_path / "next-line.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _items(50, pool=6)))
    task = load_task(TaskConfig(name="next-line", path=str(path), kind="choice", few_shot=1), path)
    assert len(task.items) == 50

    # the items exercise the rule: many pairs tokenize otherwise when cut where written
    moved = sum(
        encode(store.tokenizer, it.context) + encode(store.tokenizer, cont)
        != [t for part in encode_pair(store.tokenizer, it.context, cont) for t in part]
        for it in task.items
        for cont in it.continuations
    )
    assert moved >= 20
    cut = sum(
        1 + sum(map(len, encode_pair(store.tokenizer, it.context, c))) > seq_len + 1
        for it in task.items
        for c in it.continuations
    )
    assert cut > 0

    bos, eos = store.special["bos"], store.special.get("eos")
    ours = score_task(
        model, task, store.tokenizer, bos, seq_len=seq_len, decoder_model=model, eos=eos
    )
    folder = export_hf(
        model,
        tmp_path / "hf",
        tokenizer_path=ws.version_dir("tokens", loaded.tokens_version) / "tokenizer.json",
        special=loaded.tokenizer["special"],
        max_positions=seq_len,
    )
    (theirs,) = run_harness(folder, [task], tmp_path / "work", seq_len=seq_len)

    ll_ours, ll_theirs = ours.per_item["loglik"], theirs.per_item["loglik"]
    assert [len(x) for x in ll_ours] == [len(x) for x in ll_theirs] == [3] * 50
    np.testing.assert_allclose(
        np.concatenate(ll_ours), np.concatenate(ll_theirs), rtol=1e-5, atol=1e-4
    )
    assert ours.per_item["acc"] == theirs.per_item["acc"]
    assert ours.per_item["acc_norm"] == theirs.per_item["acc_norm"]
    assert ours.metrics == theirs.metrics

    # not a trivial model: its picks vary, and the length norm changes some of them
    picks = [int(np.argmax(x)) for x in ll_ours]
    lengths = [[len(c) for c in it.choices] for it in task.items]
    normed = [int(np.argmax(np.array(x) / n)) for x, n in zip(ll_ours, lengths, strict=True)]
    assert len(set(picks)) == 3 and picks != normed
    assert 0 < sum(ours.per_item["acc"]) < 50


def test_a_harness_that_fails_is_one_line_with_its_error(tmp_path):
    """No model where the harness is sent (and no network to find one): its error, not
    a traceback, in one line."""
    pytest.importorskip(
        "lm_eval", reason="lm-evaluation-harness is not installed: pip install 'ledgerlm[lmeval]'"
    )
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"context": "a", "choices": ["b", "c"], "gold": 0}) + "\n")
    task = load_task(TaskConfig(name="t", path=str(path), kind="choice"), path)
    with pytest.raises(HarnessError) as err:
        run_harness(tmp_path / "no-model", [task], tmp_path / "work", seq_len=16)
    line = str(err.value)
    assert line.startswith("lm-evaluation-harness failed (exit 1): ") and "\n" not in line
    assert "no-model" in line, line
