"""Records of the built-in tasks, made from material no training document holds.

``arith`` (exact): the synthetic math generator's own line forms (``builtin._math_line``),
cut before the last ``" = "``: ``{"context": "37 + 45 =", "answer": "82"}``. Its items
come from seeds the training corpus can never use (``arith_rng``), so they are new
draws of the same distribution the model trained on.

``code-next-line`` (choice): a standard-library function of the data version's held-out
splits (val, test; never train), cut after a few of its lines (seeded); the gold is its
next non-blank line, the three others are lines of other held-out functions indented
otherwise (so each could not equally well come next). The context
ends with a newline and the delimiter is empty, so (by the harness's rule) the newline
moves into every continuation and each choice is a whole line as the file has it.

Both are then checked against the training split by the contamination pass's n-grams
(``overlapping``): a generator can draw a line the corpus happens to hold, and a
standard-library function can have a twin in another module.

Everything streams: a split is read shard by shard, and only the held-out code
documents' functions are kept (a few hundred lines each).
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.config import ContaminationConfig
from ledgerlm.data.builtin import _math_line
from ledgerlm.data.contamination import contamination_report, eval_set
from ledgerlm.data.shingles import normalize_text, prenormalize, shingle_batch
from ledgerlm.data.verify import iter_split

# Bump when the records a task makes from the same data version change, so the
# materialized files of earlier versions of these rules are made again.
TASKS_FORMAT = 3

HELD_OUT = ("val", "test")
# The few-shot pool ("split": "train" records) each task file holds before its scored items.
POOL = 32
ARITH_ITEMS = 1000
CODE_ITEMS = 1000
# A cut falls within a function's first lines, so a context stays short enough to score
# cheaply; the gold line is at least the second line (the ``def`` line is never the gold).
MAX_CUT_LINE = 16
DISTRACTORS = 3


def arith_rng(index: int) -> random.Random:
    """The generator of arith item ``index``.

    Training math document i is ``random.Random(f"{seed}:{i}")`` with an integer seed
    (``builtin.math_document_text``): that string always starts with a digit or ``-``.
    A string seed is hashed whole (sha512 of its bytes), so a seed that starts with a
    letter, as this one does, can never give a training document's stream, whatever
    the corpus seed or the number of documents.
    """
    return random.Random(f"task-arith:{index}")


def arith_records(items: int = ARITH_ITEMS, pool: int = POOL) -> list[dict[str, Any]]:
    """``pool`` few-shot records, then ``items`` scored ones; every context is distinct
    (an item never repeats one before it, nor a few-shot example)."""
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    index = 0
    while len(records) < pool + items:
        line = _math_line(arith_rng(index))
        index += 1
        cut = line.rindex(" = ")
        context, answer = line[:cut] + " =", line[cut + 3 :]
        if context in seen:
            continue
        seen.add(context)
        record: dict[str, Any] = {"context": context, "answer": answer}
        if len(records) < pool:
            record["split"] = "train"
        records.append(record)
    return records


@dataclass(frozen=True)
class Function:
    """A function's lines as its file has them (no trailing newline on a line)."""

    doc_id: str
    name: str
    lines: tuple[str, ...]


def _parsed(text: str) -> ast.Module | None:
    """``text`` parsed; a document cut short (``max_doc_chars``) is parsed up to its last
    top-level statement before the break, so its whole functions still count."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError) as err:
        lines = text.splitlines()
        stop = min(getattr(err, "lineno", None) or len(lines), len(lines))
        for k in range(stop - 1, 0, -1):
            if lines[k][:1].strip() and not lines[k].startswith(("#", ")", "]", "}")):
                try:
                    return ast.parse("\n".join(lines[:k]))
                except (SyntaxError, ValueError):
                    return None
        return None


def functions_of(doc_id: str, text: str) -> list[Function]:
    """Every function and method of a Python document, outermost first, in file order."""
    tree = _parsed(text)
    if tree is None:
        return []
    lines = text.splitlines()
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
    ]
    found.sort(key=lambda node: node.lineno)
    return [
        Function(doc_id, node.name, tuple(lines[node.lineno - 1 : node.end_lineno]))
        for node in found
    ]


def held_out_functions(data_dir: Path, manifest: dict[str, Any]) -> Iterator[Function]:
    """The functions of the version's held-out code documents (val, then test), read
    shard by shard; the training split is never read here."""
    for split in HELD_OUT:
        for table in iter_split(data_dir, manifest, split):
            code = [i for i, d in enumerate(table.column("domain").to_pylist()) if d == "code"]
            if not code:
                continue
            ids = table.column("id").take(code).to_pylist()
            texts = table.column("text").take(code).to_pylist()
            for doc_id, text in zip(ids, texts, strict=True):
                yield from functions_of(doc_id, text)


def distinct(functions: Iterable[Function]) -> list[Function]:
    """The functions with each text once, the first of its twins kept (the order given:
    ``held_out_functions``'s is fixed). Two modules can hold the same function, or a
    method the same body at another depth (``normalize_text``: case and spacing aside):
    one of them among the few-shot examples would show a scored item its own answer,
    and two scored would count one item twice against the binomial error."""
    seen: set[str] = set()
    out = []
    for fn in functions:
        text = normalize_text("\n".join(fn.lines))
        if text not in seen:
            seen.add(text)
            out.append(fn)
    return out


def _gold_lines(fn: Function) -> list[int]:
    """Where a gold line may be: a non-blank line after the first, within the cut range."""
    return [j for j in range(1, min(len(fn.lines), MAX_CUT_LINE + 1)) if fn.lines[j].strip()]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def code_next_line_records(
    functions: Iterable[Function],
    seed: int = 0,
    items: int = CODE_ITEMS,
    pool: int = POOL,
) -> list[dict[str, Any]]:
    """One record per distinct function (``distinct``: items stay independent for the
    binomial error, and no few-shot example is a scored item's twin): the
    first ``pool`` (at most a fifth of the functions) are few-shot records, then at most
    ``items`` scored ones. Functions are
    shuffled (seeded) first, so a ``limit`` takes a sample of every module, not the first
    files in name order. Distractors are non-blank lines of other functions whose
    stripped text differs from the gold's and from each other's, each indented other
    than the gold: a statement at the gold's own depth could often follow as well as the
    gold does (``x = 1`` for ``y = 2``), an item no model can get right, while a line at
    another depth fits only where the function's blocks say it may."""
    usable = [fn for fn in distinct(functions) if _gold_lines(fn)]
    rng = random.Random(f"task-code-next-line:{seed}")
    rng.shuffle(usable)
    pool = min(pool, len(usable) // 5)  # a small version keeps most functions to score
    usable = usable[: pool + items]
    elsewhere = [(k, fn.lines[j]) for k, fn in enumerate(usable) for j in range(1, len(fn.lines))]
    elsewhere = [(k, line) for k, line in elsewhere if line.strip()]
    records = []
    for k, fn in enumerate(usable):
        at = rng.choice(_gold_lines(fn))
        gold = fn.lines[at]
        taken = {gold.strip()}
        choices = [gold]
        for _ in range(100 * DISTRACTORS):
            if len(choices) > DISTRACTORS:
                break
            other, line = rng.choice(elsewhere)
            if other != k and line.strip() not in taken and _indent(line) != _indent(gold):
                taken.add(line.strip())
                choices.append(line)
        if len(choices) <= DISTRACTORS:
            continue  # too few held-out lines to choose from
        order = list(range(len(choices)))
        rng.shuffle(order)
        record: dict[str, Any] = {
            "context": "\n".join(fn.lines[:at]) + "\n",
            "choices": [choices[i] for i in order],
            "gold": order.index(0),
            "doc": fn.doc_id,
            "function": fn.name,
        }
        if k < pool:
            record["split"] = "train"
        records.append(record)
    return records


def scored_text(record: dict[str, Any]) -> str:
    """What a model must not have seen for an item to be fair: its context and its
    right continuation (the distractors come from elsewhere and may be common lines)."""
    if "choices" in record:
        return record["context"] + record["choices"][record["gold"]]
    return f"{record['context']} {record['answer']}"


def overlapping(
    texts: Sequence[str], data_dir: Path, manifest: dict[str, Any], ngram: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Which texts share text with the training split, and the contamination pass's
    report of them (``contamination_report``: examples, ngram_overlap, contaminated).

    A text is contaminated when one of its word ``ngram``-grams occurs in a training
    document, the pass's rule. A text shorter than ``ngram`` words (an arith item has
    three to eight) is one n-gram of all its words, as ``eval_set`` makes it, but then
    the pass would never find it inside a longer training text; so each such text is
    checked with n = its own length: contaminated when all its words occur in a row in
    a training document (``37 + 45 = 82`` as a line of a math document).
    """
    lengths = [min(ngram, len(normalize_text(t).split()) or 1) for t in texts]
    groups = {n: [i for i, m in enumerate(lengths) if m == n] for n in sorted(set(lengths))}
    sets = [
        eval_set(f"{n}-grams", [texts[i] for i in at], ContaminationConfig(ngram=n))
        for n, at in groups.items()
    ]
    matched: list[np.ndarray] = []
    for table in iter_split(data_dir, manifest, "train"):
        train = prenormalize(table.column("text").to_pylist())  # once for every n
        for n, es in zip(groups, sets, strict=True):
            hashes = shingle_batch(train, n, unique=False, normalized=True).hashes
            matched.append(np.unique(hashes[np.isin(hashes, es.all_ngrams)]))
    found = np.unique(np.concatenate(matched)) if matched else np.zeros(0, np.uint64)
    hit = np.zeros(len(texts), dtype=bool)
    for at, es in zip(groups.values(), sets, strict=True):
        hit[at] = [np.isin(g, found).any() for g in es.doc_ngrams]
    rows = contamination_report(sets, found)["files"]
    return hit, {
        "ngram": ngram,
        "examples": len(texts),
        "contaminated": sum(r["contaminated"] for r in rows),
        "by_length": {r["eval_file"]: [r["contaminated"], r["examples"]] for r in rows},
    }
