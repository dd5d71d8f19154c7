"""A task file's records as the items one evaluation scores.

A task file is JSONL, one record an object, blank lines skipped. A ``choice`` record
holds a context, a non-empty list of choice strings and the gold index (an integer, or a
string of digits as Hugging Face's HellaSwag writes it); an ``exact`` or
``bpb`` record a context and an answer (the field names are the task's, ``TaskConfig``).
Records whose ``split_field`` is ``"train"`` are the few-shot pool and are never
scored; the others are scored in file order, the first ``limit`` of them when it is set.

Few-shot examples are drawn per scored item from the pool, by a generator seeded with
the task's seed and the item's position among the scored records
(``random.Random(f"{seed}:{i}").sample(pool, k)``), so an item's prompt does not depend
on ``limit``, on which rank scores it, or on the other items. The prompt is built as
lm-evaluation-harness builds it: each example ``context + delimiter + target`` joined by
``fewshot_delimiter``, then ``fewshot_delimiter`` and the item's own context.

Every bad record is a ``TaskFileError`` naming the file and its line; nothing of a file
with one is used. The file's sha256 (``TaskSet.digest``) is what the run records, so an
evaluation names the exact items it scored.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ledgerlm.config import TaskConfig

try:
    import orjson

    _loads = orjson.loads
    _JSONError: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:  # pragma: no cover - orjson is a runtime dependency
    _loads = json.loads
    _JSONError = (json.JSONDecodeError, UnicodeDecodeError)


class TaskFileError(ValueError):
    """A task file that cannot be used: one line, ``path:line: reason`` (``path: reason``
    for the file as a whole)."""

    def __init__(self, path: Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = path, line, reason


@dataclass(frozen=True)
class Item:
    """One scored record, its prompt built (few-shot examples included)."""

    line: int  # 1-based line in the file
    context: str  # few-shot examples + this record's context
    continuations: tuple[
        str, ...
    ]  # choice: delimiter + each choice; exact/bpb: (delimiter + answer,)
    choices: tuple[str, ...]  # the raw choice strings (acc_norm's lengths); exact/bpb: (answer,)
    gold: int  # choice: gold index; else 0
    answer: str  # exact/bpb: the raw answer; choice: choices[gold]


@dataclass(frozen=True)
class TaskSet:
    """A task's scored items, in file order after ``limit``, and the file they came from."""

    cfg: TaskConfig
    path: Path
    items: tuple[Item, ...]
    digest: str  # sha256 of the file's bytes

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def kind(self) -> str:
        return self.cfg.task_kind


@dataclass(frozen=True)
class _Record:
    line: int
    context: str
    choices: tuple[str, ...]
    gold: int
    train: bool

    @property
    def target(self) -> str:
        return self.choices[self.gold]


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _shown(value: Any, most: int = 40) -> str:
    """A value as JSON, cut to ``most`` characters, for an error line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= most else text[: most - 3] + "..."


def _record(cfg: TaskConfig, raw: Any, line: int, fail: Callable[[str], NoReturn]) -> _Record:
    """One parsed line as a record of the task's kind; ``fail(reason)`` raises."""
    if not isinstance(raw, dict):
        fail(f"a record must be a JSON object, not {_type(raw)}")
    kind = cfg.task_kind
    needed = [cfg.context_field]
    needed += [cfg.choices_field, cfg.gold_field] if kind == "choice" else [cfg.answer_field]
    for name in needed:
        if name not in raw:
            fail(f"missing field {name!r} (a {kind} record needs {', '.join(map(repr, needed))})")
    context = raw[cfg.context_field]
    if not isinstance(context, str):
        fail(f"field {cfg.context_field!r} must be a string, not {_type(context)}")
    if kind == "choice":
        choices, gold = raw[cfg.choices_field], raw[cfg.gold_field]
        if not isinstance(choices, list) or not choices:
            got = "an empty list" if isinstance(choices, list) else _type(choices)
            fail(f"field {cfg.choices_field!r} must be a non-empty list of strings, not {got}")
        for i, choice in enumerate(choices):
            if not isinstance(choice, str):
                fail(
                    f"field {cfg.choices_field!r}: choice {i} must be a string, not {_type(choice)}"
                )
            if not choice:  # acc_norm divides by its length
                fail(f"field {cfg.choices_field!r}: choice {i} is empty")
        if isinstance(gold, str) and gold.isascii() and gold.isdigit():
            gold = int(gold)  # "3", as Hugging Face's HellaSwag writes it: the harness's reading
        if isinstance(gold, bool) or not isinstance(gold, int):
            fail(
                f"field {cfg.gold_field!r} must be a 0-based index of the choices, not "
                f"{_type(gold)} {_shown(gold)}"
            )
        if not 0 <= gold < len(choices):
            fail(f"field {cfg.gold_field!r} = {gold} is not an index of {len(choices)} choices")
        answers = tuple(choices)
    else:
        answer = raw[cfg.answer_field]
        if not isinstance(answer, str):
            fail(f"field {cfg.answer_field!r} must be a string, not {_type(answer)}")
        if kind == "bpb" and not cfg.delimiter + answer:  # bits per byte of no bytes
            fail(f"field {cfg.answer_field!r} is empty and so is the delimiter: no bytes to score")
        answers, gold = (answer,), 0
    train = raw.get(cfg.split_field) == "train"
    return _Record(line=line, context=context, choices=answers, gold=gold, train=train)


def _records(cfg: TaskConfig, path: Path, data: bytes) -> list[_Record]:
    records = []
    for number, text in enumerate(data.split(b"\n"), start=1):
        if not text.strip():
            continue

        def fail(reason: str, number: int = number) -> NoReturn:
            raise TaskFileError(path, number, reason)

        try:
            raw = _loads(text)
        except _JSONError as e:
            fail(f"not JSON ({str(e).splitlines()[0]})")
        records.append(_record(cfg, raw, number, fail))
    return records


def _prompt(cfg: TaskConfig, examples: list[_Record], context: str) -> str:
    """lm-evaluation-harness's few-shot context: labelled examples, then the context."""
    if not examples:
        return context
    shots = cfg.fewshot_delimiter.join(e.context + cfg.delimiter + e.target for e in examples)
    return shots + cfg.fewshot_delimiter + context


def load_task(cfg: TaskConfig, path: Path) -> TaskSet:
    """Read and check a task file (module doc); every problem is a ``TaskFileError``."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TaskFileError(path, None, f"cannot read the task file ({e.strerror})") from None
    records = _records(cfg, path, data)
    if not records:
        raise TaskFileError(path, None, "no records (the task file is empty)")
    pool = [r for r in records if r.train]
    scored = [r for r in records if not r.train]
    if not scored:
        raise TaskFileError(
            path, None, f"no records to score (every record has {cfg.split_field} = 'train')"
        )
    k = cfg.few_shot
    if k > len(pool):
        raise TaskFileError(
            path,
            None,
            f"few_shot = {k} needs {k} records with {cfg.split_field} = 'train'; "
            f"the file has {len(pool)}",
        )
    if k:
        for r in pool:
            if not r.target:  # the harness would show its context alone: another prompt
                raise TaskFileError(
                    path, r.line, "a few-shot example needs an answer (this one is empty)"
                )
    if cfg.limit:
        scored = scored[: cfg.limit]
    items = []
    for i, r in enumerate(scored):
        examples = random.Random(f"{cfg.seed}:{i}").sample(pool, k) if k else []
        context = _prompt(cfg, examples, r.context)
        items.append(
            Item(
                line=r.line,
                context=context,
                continuations=tuple(cfg.delimiter + c for c in r.choices),
                choices=r.choices,
                gold=r.gold,
                answer=r.target,
            )
        )
    return TaskSet(cfg=cfg, path=path, items=tuple(items), digest=hashlib.sha256(data).hexdigest())
