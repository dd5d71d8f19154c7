"""The tiny recipe with downstream tasks, for the end-to-end task tests: three real JSONL
task files (a choice task, an exact task with few-shot examples, a bits-per-byte task)
and the recipe that names them, written into a test's folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

from cli_runner import TINY

OPS = {"add": "a + b", "sub": "a - b", "mul": "a * b", "size": "len(a)", "first": "a[0]"}
WORDS = ["the", "data", "is", "read", "from", "the", "file", "and", "the", "model"]
WORDS += ["is", "trained", "on", "the", "tokens", "of", "each"]


def task_files(root: Path) -> dict[str, Path]:
    """``pick`` (choice: a function's return expression among three), ``sums`` (exact:
    ``a + b =`` and its sum, two few-shot examples from its train records) and ``prose``
    (bpb: words after words), seeded."""
    rng = random.Random(0)
    pick = []
    for _ in range(24):
        name = rng.choice(sorted(OPS))
        choices = rng.sample([v for k, v in OPS.items() if k != name], 2)
        gold = rng.randrange(3)
        choices.insert(gold, OPS[name])
        pick.append({"context": f"def {name}(a, b):\n    return", "choices": choices, "gold": gold})
    sums = [{"context": f"{a} + {b} =", "answer": str(a + b)} for a, b in _pairs(rng, 12)]
    shots = _pairs(rng, 3)
    sums += [{"context": f"{a} + {b} =", "answer": str(a + b), "split": "train"} for a, b in shots]
    prose = [
        {"context": " ".join(rng.sample(WORDS, 5)), "answer": " ".join(rng.sample(WORDS, 4))}
        for _ in range(16)
    ]
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, records in (("pick", pick), ("sums", sums), ("prose", prose)):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in records))
    return paths


def _pairs(rng: random.Random, n: int) -> list[tuple[int, int]]:
    return [(rng.randrange(1, 50), rng.randrange(1, 50)) for _ in range(n)]


KINDS = {"pick": ("choice", ""), "sums": ("exact", "few_shot = 2\nmax_new_tokens = 4\n")}
KINDS["prose"] = ("bpb", "")


def tasks_recipe(folder: Path, eval_lines: str = "", names=tuple(KINDS)) -> Path:
    """The tiny recipe with the tasks ``names`` (their files in ``folder/tasks``), and
    ``eval_lines`` (TOML) added to its ``[eval]`` table."""
    paths = task_files(folder / "tasks")
    text = TINY.read_text().replace("[eval]\n", f"[eval]\n{eval_lines}")
    for name in names:
        kind, extra = KINDS[name]
        text += f'\n[[eval.tasks]]\nname = "{name}"\npath = "{paths[name]}"\nkind = "{kind}"\n'
        text += extra
    recipe = folder / "tasks.toml"
    recipe.write_text(text)
    return recipe
