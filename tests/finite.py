"""Shared by tests of finite numbers: ``assert_finite`` for a record that claims to hold
finite numbers only (``json.dumps`` writes NaN and Infinity without complaint, so it
proves nothing of the kind), and ``Poison``, a forward hook that makes one output NaN."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def assert_finite(value: Any, path: str = "") -> None:
    """Every number in ``value``, nested dicts, lists and tuples walked to the bottom, is
    finite; a failure names the path of the first that is not (``evaluations[1].bpb``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert_finite(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            assert_finite(item, f"{path}[{i}]")
    elif isinstance(value, Real) and not isinstance(value, bool):
        assert math.isfinite(value), f"{path or 'value'} = {value!r} is not finite"


class Poison:
    """Forward hook: the model's output on the ``at``-th call (1-based) becomes NaN;
    ``calls`` counts the forwards."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, module, inputs, output):
        self.calls += 1
        return output * math.nan if self.calls == self.at else output
