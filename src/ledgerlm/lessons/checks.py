"""What a lesson reports: its checks of computed against expected values, its result,
and the collector a lesson builds its checks with."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

Expected = Mapping[str, Any]


@dataclass(frozen=True)
class Check:
    """One computed value against the value the seed gives."""

    what: str
    got: Any
    expected: Any  # a number (Fraction for an exact ratio), a list of them, or a bound
    passed: bool

    def line(self) -> str:
        return f"{mark(self)} {self.what}: {fmt(self.got)} (expected {fmt(self.expected)})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "got": _plain(self.got),
            "expected": _plain(self.expected),
            "passed": self.passed,
        }


@dataclass(frozen=True)
class LessonResult:
    """What a lesson shows (``lines``), its checks and verdict, and the computed values."""

    name: str
    title: str
    source: str  # where the worked numbers come from
    lines: list[str]
    checks: list[Check]
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "source": self.source,
            "passed": self.passed,
            "lines": list(self.lines),
            "checks": [c.to_dict() for c in self.checks],
            "values": _plain(self.values),
        }


@dataclass(frozen=True)
class Lesson:
    name: str
    summary: str  # one line for `ledgerlm lessons --help`
    run: Callable[..., LessonResult]


def _plain(x: Any) -> Any:
    """JSON-able: Fractions and numpy/torch scalars as floats, tuples as lists."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        v = float(x)
        return v if math.isfinite(v) else str(v)
    return str(x)


def fmt(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, Fraction):
        return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real):
        v = float(x)
        return "0" if abs(v) < 1e-12 else f"{v:.4g}"  # rounding residue shows as 0
    if isinstance(x, list | tuple):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return str(x)


def _close(got: Any, want: Any, tol: float) -> bool:
    if isinstance(want, list | tuple):
        return (
            isinstance(got, list | tuple)
            and len(got) == len(want)
            and all(_close(g, w, tol) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, numbers.Real) and not isinstance(want, bool):
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            return False
        g, w = float(got), float(want)
        return math.isfinite(g) and abs(g - w) <= tol * max(1.0, abs(w))
    return bool(got == want)


def mark(*checks: Check) -> str:
    return "ok  " if all(c.passed for c in checks) else "FAIL"


class Checks:
    """Collects the checks of one lesson against its expected values."""

    def __init__(self, defaults: Expected, overrides: Expected | None) -> None:
        unknown = sorted(set(overrides or {}) - set(defaults))
        if unknown:
            raise ValueError(
                f"unknown expected value(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(defaults))})"
            )
        self.want = {**defaults, **(overrides or {})}
        self.items: list[Check] = []

    def equal(self, key: str, what: str, got: Any, tol: float = 1e-9) -> Check:
        want = self.want[key]
        check = Check(what, got, want, _close(got, want, tol))
        self.items.append(check)
        return check

    def below(self, key: str, what: str, got: float) -> Check:
        bound = float(self.want[key])
        check = Check(what, got, f"< {fmt(bound)}", math.isfinite(got) and got < bound)
        self.items.append(check)
        return check

    def above(self, key: str, what: str, got: float) -> Check:
        bound = float(self.want[key])
        ok = not math.isfinite(got) or got > bound  # inf/nan: diverged beyond any bound
        check = Check(what, got, f"> {fmt(bound)}", ok)
        self.items.append(check)
        return check
