"""Shared by tests that claim a record holds finite numbers only: ``json.dumps`` writes
NaN and Infinity without complaint, so it proves nothing of the kind."""

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
