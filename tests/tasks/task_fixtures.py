"""The tasks tests' corpus, model shape and task records, and task files written for real."""

from __future__ import annotations

import json
from pathlib import Path

from ledgerlm.config import ModelConfig, TaskConfig
from ledgerlm.tasks.items import TaskSet, load_task

CORPUS = [
    "the cat sat on the mat. the dog sat on the mat. a red hat on the cat.\n",
    "12 + 30 = 42\n45 + 17 = 62\n99 + 11 = 110\n",
    "def add(a, b):\n    return a + b\n",
]
CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4)


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def task(path: Path, records: list, kind: str, **cfg) -> TaskSet:
    """``records`` written as a JSONL file at ``path`` and loaded as a task of ``kind``."""
    write_jsonl(path, records)
    return load_task(TaskConfig(name=cfg.pop("name", "t"), path=str(path), kind=kind, **cfg), path)


CHOICE = [
    {"context": "the cat sat on the", "choices": ["mat", "dog", "hat"], "gold": 0},
    {"context": "12 + 30 =", "choices": ["42", "7", "110"], "gold": 0},
    {"context": "a red hat on the ", "choices": ["cat.", "mat", "dog sat"], "gold": 2},
    {"context": "def add(a, b):\n", "choices": ["    return a + b", "the dog"], "gold": 0},
    {"context": "45 + 17 =", "choices": ["62", "sat", "a", "99 + 11"], "gold": 1},
    {"context": "the dog", "choices": ["sat on the mat.", "= 42"], "gold": 0},
    {"context": "99 + 11 = ", "choices": ["110", "12"], "gold": 1},
]

ANSWERS = [
    {"context": "12 + 30 =", "answer": "42"},
    {"context": "45 + 17 =", "answer": "62"},
    {"context": "the cat sat on the", "answer": "mat."},
    {"context": "99 + 11 =", "answer": "110"},
    {"context": "def add(a, b):\n", "answer": "return a + b"},
    {"context": "a red hat", "answer": "on the cat."},
]
