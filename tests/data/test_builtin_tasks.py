"""The built-in tasks' records: arith answers are the arithmetic of their contexts and
come from seeds no training document uses; code-next-line's gold is the true next line
of a held-out function and its distractors are other held-out lines; the contamination
check finds an item planted in the training split."""

from __future__ import annotations

import json
import math
import random
import re

import pyarrow.parquet as pq
import pytest

from ledgerlm.config import Recipe
from ledgerlm.data import builtin_tasks
from ledgerlm.data.builtin_tasks import (
    Function,
    arith_records,
    code_next_line_records,
    distinct,
    functions_of,
    held_out_functions,
    overlapping,
    scored_text,
)
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.workspace import Workspace

_NUMBER = r"(-?\d+)"
FORMS = [
    (re.compile(rf"^{_NUMBER} ([-+*/]) {_NUMBER} =$"), "binary"),
    (re.compile(r"^\((\d+) ([-+]) (\d+)\) \* (\d+) =$"), "paren"),
    (re.compile(r"^solve (\d+)x \+ (\d+) = (-?\d+): x =$"), "solve"),
    (re.compile(r"^expand (\d+)\(x \+ (\d+)\) =$"), "expand"),
    (re.compile(r"^gcd\((\d+), (\d+)\) =$"), "gcd"),
    (re.compile(r"^(\d+)\^(\d+) =$"), "power"),
]


def _binary(a: int, op: str, b: int) -> int:
    if op == "/":
        assert a % b == 0, f"{a} / {b} is not exact"
        return a // b
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def expected_answer(context: str) -> tuple[str, str]:
    """The answer worked out from the context alone, and the context's form."""
    for pattern, form in FORMS:
        m = pattern.match(context)
        if m is None:
            continue
        g = m.groups()
        if form == "binary":
            return str(_binary(int(g[0]), g[1], int(g[2]))), form
        if form == "paren":
            return str(_binary(int(g[0]), g[1], int(g[2])) * int(g[3])), form
        if form == "solve":
            a, b, c = map(int, g)
            assert (c - b) % a == 0
            return str((c - b) // a), form
        if form == "expand":
            a, b = map(int, g)
            return f"{a}x + {a * b}", form
        if form == "gcd":
            return str(math.gcd(int(g[0]), int(g[1]))), form
        return str(int(g[0]) ** int(g[1])), form
    raise AssertionError(f"no form of the math generator: {context!r}")


def test_arith_answers_are_the_arithmetic_of_their_contexts():
    records = arith_records(items=600, pool=20)
    assert len(records) == 620
    assert [r.get("split") for r in records[:20]] == ["train"] * 20
    assert all("split" not in r for r in records[20:])
    forms = set()
    for r in records:
        answer, form = expected_answer(r["context"])
        assert r["answer"] == answer, r
        forms.add(form)
    # the generator's forms, + among them, and every context once
    assert forms == {"binary", "paren", "solve", "expand", "gcd", "power"}
    assert any(r["context"].split()[1] == "+" for r in records)
    assert len({r["context"] for r in records}) == len(records)
    assert arith_records(items=600, pool=20) == records  # a pure function


def test_arith_seeds_are_none_of_the_training_documents_seeds():
    # a training math document i of corpus seed s draws from Random(f"{s}:{i}")
    training = {
        tuple(random.Random(f"{s}:{i}").random() for _ in range(4))
        for s in range(-3, 4)
        for i in range(300)
    }
    task = {tuple(builtin_tasks.arith_rng(i).random() for _ in range(4)) for i in range(2000)}
    assert not task & training


def test_functions_are_read_whole_also_from_a_document_cut_short():
    text = (
        "import os\n\n"
        "def first(a):\n    b = a + 1\n\n    return b\n\n"
        "class K:\n    def method(self):\n        return 2\n\n"
        "def cut(x):\n    y = (x +\n"
    )
    fns = functions_of("m.py", text)
    assert [(f.name, f.lines) for f in fns] == [
        ("first", ("def first(a):", "    b = a + 1", "", "    return b")),
        ("method", ("    def method(self):", "        return 2")),
    ]


def _function(doc: str, i: int, indent: str = "") -> Function:
    body = (
        f"def f{i}(x):",
        f"    y = x * {i}",
        "",
        f"    if y > {i}:",
        f"        y = y - {i}",
        f"    return y + {i}",
    )
    return Function(doc, f"f{i}", tuple(indent + line if line else line for line in body))


def _functions(n: int) -> list[Function]:
    return [_function(f"doc{i % 5}", i) for i in range(n)]


def test_code_next_line_gold_is_the_next_line_and_distractors_are_indented_otherwise():
    fns = _functions(60)
    records = code_next_line_records(fns, items=40, pool=8)
    assert len(records) == 48
    by_name = {f.name: f for f in fns}
    for r in records:
        fn = by_name[r["function"]]
        gold = r["choices"][r["gold"]]
        assert r["context"].endswith("\n")
        # context + gold is the function's first lines, and the gold is not blank
        assert "\n".join(fn.lines).startswith(r["context"] + gold)
        assert gold.strip() and gold in fn.lines[1:]
        assert len(r["choices"]) == 4
        assert len({c.strip() for c in r["choices"]}) == 4
        others = [c for i, c in enumerate(r["choices"]) if i != r["gold"]]
        for c in others:
            assert c not in fn.lines  # lines of other functions (each function's are its own)
            assert len(c) - len(c.lstrip()) != len(gold) - len(gold.lstrip())
            assert any(c in f.lines for f in fns if f is not fn)
    assert {r["gold"] for r in records} == {0, 1, 2, 3}  # shuffled
    assert code_next_line_records(fns, items=40, pool=8) == records


JUNK = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


def _module(i: int) -> str:
    """A held-out module of six functions nobody else wrote."""
    return "".join(
        f"def m{i}_f{j}(value_{j}):\n"
        f"    total_{i}_{j} = value_{j} * {i * 10 + j}\n"
        f"    if total_{i}_{j} > {j}:\n"
        f"        return total_{i}_{j} - {i}\n"
        f"    return value_{j} + {i + j}\n\n"
        for j in range(6)
    )


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A data version whose validation split is 12 held-out modules (72 functions) and
    whose training split holds word salad plus two of those functions, verbatim."""
    root = tmp_path_factory.mktemp("planted")
    modules = {f"mod{i}.py": _module(i) for i in range(12)}
    held = root / "held.jsonl"
    held.write_text(
        "".join(
            json.dumps({"id": k, "text": v, "domain": "code"}) + "\n" for k, v in modules.items()
        )
    )
    rng = random.Random(0)
    rows = [
        {"id": f"t{i}", "text": " ".join(rng.choice(JUNK) for _ in range(60)), "domain": "web"}
        for i in range(30)
    ]
    fns = [f for k, v in modules.items() for f in functions_of(k, v)]
    leaks = [fns[3], fns[40]]
    rows[5]["text"] += "\n" + "\n".join(leaks[0].lines) + "\n"
    rows[9]["text"] = "\n".join(leaks[1].lines) + "\n" + rows[9]["text"]
    trained = 'def trained_only(x):\n    """Seen in training."""\n    return x * 2\n'
    rows.append({"id": "code0", "text": trained, "domain": "code"})
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = Recipe.model_validate(
        {
            "data": {"sources": [str(root / "train.jsonl")], "near_dedup": {"enabled": False}},
            "eval": {"sources": [str(held)]},
        }
    )
    data = prepare_data(recipe.data_stage(), Workspace(root / "ws"), base=root)
    return data, fns, leaks


def test_held_out_functions_come_from_the_held_out_splits_only(planted):
    data, fns, _ = planted
    found = list(held_out_functions(data.path, data.manifest))
    assert found == fns
    train_ids = {
        r["id"]
        for f in data.manifest["files"]
        if f["split"] == "train"
        for r in pq.read_table(data.path / f["path"], columns=["id"]).to_pylist()
    }
    assert "code0" in train_ids and not {f.doc_id for f in found} & train_ids


def test_contamination_finds_the_functions_planted_in_training(planted):
    data, fns, leaks = planted
    records = code_next_line_records(fns, items=72, pool=0)
    texts = [scored_text(r) for r in records]
    hit, report = overlapping(texts, data.path, data.manifest, ngram=13)
    leaked = {f.name for f in leaks}
    assert [r["function"] for r, h in zip(records, hit, strict=True) if h] == [
        r["function"] for r in records if r["function"] in leaked
    ]
    assert report["examples"] == 72 and report["contaminated"] == 2 == hit.sum()


def test_contamination_finds_a_short_item_inside_a_training_line(planted):
    data, *_ = planted
    # shorter than 13 words: contaminated when all its words occur in a row in training
    texts = ["gamma kappa = 3", "delta + 4 = 6", "alpha beta gamma nowhere"]
    train = " ".join(
        r["text"]
        for f in data.manifest["files"]
        if f["split"] == "train"
        for r in pq.read_table(data.path / f["path"], columns=["text"]).to_pylist()
    )
    assert "alpha beta gamma nowhere" not in train
    line = "value_3 * 3"  # of the leaked fns[3], now a training line
    hit, _ = overlapping([*texts, line], data.path, data.manifest, ngram=13)
    assert hit.tolist() == [False, False, False, True]


# Twins: the same function in two modules (or a method with the same body at another
# depth) gives one record, that of the first found.


def test_each_function_text_gives_one_record_the_first_twins():
    """40 functions, each also in a second module (every other one as a method, one
    level deeper): 40 records, none of a twin; a twin in the few-shot pool would show
    the scored twin's answer."""
    first = [_function(f"mod{i}", i) for i in range(40)]
    twins = [_function(f"copy{i}", i, "    " * (i % 2)) for i in range(40)]
    functions = [x for pair in zip(first, twins, strict=True) for x in pair]
    assert distinct(functions) == first
    records = code_next_line_records(functions, pool=8)
    assert len(records) == 40
    assert {r["doc"] for r in records} == {f"mod{i}" for i in range(40)}
    pool = [r for r in records if r.get("split") == "train"]
    assert len(pool) == 8


def test_functions_that_differ_are_all_kept_in_their_order():
    functions = [_function("a", 1), _function("b", 2), _function("c", 1)]
    functions.append(Function("d", "f1", ("def f1(x):", "    return x")))
    assert [f.doc_id for f in distinct(functions)] == ["a", "b", "d"]
