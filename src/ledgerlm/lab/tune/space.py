"""A study's search space: ``--param`` lines, checked against the recipe before anything
runs, and the ``--set`` overrides of a trial's values.

    train.lr=log:1e-4:3e-2          a float drawn on a log scale
    train.wd=float:0:0.2            a float
    train.warmup_steps=int:0:100    an integer (``int:0:100:10``: in steps of 10)
    pack.seq_len=choice:64,128,256  one of the values, each read as a TOML literal

The grid sampler takes the choice and int params only (a float range has no grid).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from typing import Any

from ledgerlm.config import Recipe, RecipeError, apply_overrides, recipe_from_dict
from ledgerlm.errors import ArgumentError

KINDS = ("log", "float", "int", "choice")
GRID_KINDS = ("choice", "int")


@dataclass(frozen=True)
class Param:
    """One searched key: ``kind`` with its bounds (``low``, ``high``, ``step``) or its
    ``choices``; ``line`` is the ``--param`` it was read from."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: int | None = None
    choices: tuple[Any, ...] = ()
    line: str = ""

    def to_dict(self) -> dict[str, Any]:
        """What the study's plan keeps of it."""
        out: dict[str, Any] = {"key": self.key, "kind": self.kind}
        if self.kind == "choice":
            out["choices"] = list(self.choices)
        else:
            out.update(low=self.low, high=self.high)
            if self.step is not None:
                out["step"] = self.step
        return out

    def distribution(self) -> Any:
        """Optuna's distribution of the param (imports Optuna)."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.kind == "choice":
            return CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), step=self.step or 1)
        return FloatDistribution(float(self.low), float(self.high), log=self.kind == "log")

    def extremes(self) -> list[Any]:
        """The values checked against the recipe: the bounds, or every choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def grid(self) -> list[Any]:
        """Every value of the param, for the grid sampler."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, self.step or 1))
        raise ArgumentError(
            "{param} {line}: the grid sampler takes choice and int params only (a float "
            "range has no grid): give its values as choice:a,b,c",
            line=repr(self.line),
        )


def _literal(text: str) -> Any:
    """A TOML literal (``128``, ``3e-3``, ``true``, ``"adamw"``), else the bare text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _number(text: str, line: str, integer: bool) -> float | int:
    value = _literal(text.strip())
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        what = "an integer" if integer else "a finite number"
        raise ArgumentError("{param} {line}: {text} is not " + what, line=line, text=repr(text))
    return value if integer else float(value)


def parse_param(line: str) -> Param:
    """One ``--param KEY=KIND:SPEC`` line (see the module doc); a bad one is one line
    naming it."""
    key, sep, spec = line.partition("=")
    key = key.strip()
    kind, colon, rest = spec.partition(":")
    kind = kind.strip()
    if not sep or not key or not colon or kind not in KINDS:
        raise ArgumentError(
            "{param} {line}: expected section.key=KIND:SPEC with KIND one of log, float, int "
            "(log:LOW:HIGH, float:LOW:HIGH, int:LOW:HIGH[:STEP]) or choice (choice:A,B,...)",
            line=repr(line),
        )
    shown = repr(line)
    if kind == "choice":
        items = [s.strip() for s in rest.split(",")]
        if not all(items):
            raise ArgumentError("{param} {line}: an empty choice", line=shown)
        choices = tuple(_literal(s) for s in items)
        if any(isinstance(c, dict | list) for c in choices):
            raise ArgumentError("{param} {line}: a choice is a scalar value", line=shown)
        if len(set(map(json.dumps, choices))) != len(choices):
            raise ArgumentError("{param} {line}: a value is given twice", line=shown)
        return Param(key, kind, choices=choices, line=line)
    parts = rest.split(":")
    want = (2, 3) if kind == "int" else (2,)
    if len(parts) not in want:
        form = "int:LOW:HIGH[:STEP]" if kind == "int" else f"{kind}:LOW:HIGH"
        raise ArgumentError("{param} {line}: expected " + form, line=shown)
    integer = kind == "int"
    low, high = (_number(p, shown, integer) for p in parts[:2])
    step = _number(parts[2], shown, True) if len(parts) == 3 else None
    if not low < high:
        raise ArgumentError("{param} {line}: LOW must be below HIGH", line=shown)
    if kind == "log" and low <= 0:
        raise ArgumentError("{param} {line}: a log range lies above 0", line=shown)
    if step is not None and (step < 1 or (high - low) % step):
        raise ArgumentError(
            "{param} {line}: STEP must be at least 1 and divide HIGH - LOW", line=shown
        )
    return Param(key, kind, low, high, step, line=line)


def parse_space(lines: list[str], base: Recipe) -> list[Param]:
    """The ``--param`` lines, each key checked against the recipe with each of its
    extreme values (an unknown key, or a value the recipe refuses, is one line naming
    the param) before anything runs."""
    if not lines:
        raise ArgumentError("{param}: give at least one, e.g. 'train.lr=log:1e-4:3e-2'")
    params = [parse_param(line) for line in lines]
    seen: set[str] = set()
    tree = base.to_dict()
    for p in params:
        if p.key in seen:
            raise ArgumentError(
                "{param} {line}: {key} is searched twice", line=repr(p.line), key=p.key
            )
        seen.add(p.key)
        for value in p.extremes():
            line = override(p.key, value)
            try:
                recipe_from_dict(apply_overrides(tree, [line]), line)
            except RecipeError as exc:
                why = str(exc)
                raise ArgumentError("{param} {line}: {why}", line=repr(p.line), why=why) from None
    return params


def grid(params: list[Param]) -> dict[str, list[Any]]:
    """The grid sampler's search space (refused for a float or log param)."""
    return {p.key: p.grid() for p in params}


def grid_size(params: list[Param]) -> int:
    return math.prod(len(v) for v in grid(params).values())


def toml_value(value: Any) -> str:
    """``value`` as the TOML literal a ``--set`` override reads back to the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a basic string: a bare 'true' would read as a bool
    raise ValueError(f"a param's value is a number, a bool or a string, got {value!r}")


def override(key: str, value: Any) -> str:
    return f"{key}={toml_value(value)}"


def overrides(params: list[Param], values: dict[str, Any]) -> list[str]:
    """A trial's ``--set`` strings, in the order the params were given."""
    return [override(p.key, values[p.key]) for p in params]
