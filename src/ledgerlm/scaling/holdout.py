"""Held-out points of a fit: which (N, D, loss) points a rule such as ``C>=1e20`` or the
K largest budgets set aside, to be scored by the fitted law rather than fitted.

A rule is ``QUANTITY OP NUMBER``: the quantity N, D, C (= 6 N D), D/N or loss, the
operator >=, <=, > or <. The top K are the K (N, D) pairs of largest compute, each with
every replicate (row) of it.
"""

from __future__ import annotations

import operator
import re

import numpy as np

from ledgerlm.errors import ArgumentError
from ledgerlm.scaling.law import flops
from ledgerlm.scaling.replicates import group_ids

_RULE = re.compile(r"^\s*(N|D|C|D/N|loss)\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def holdout_mask(
    N: np.ndarray,
    D: np.ndarray,
    loss: np.ndarray,
    holdout: str | None = None,
    holdout_top: int = 0,
) -> np.ndarray:
    """The points to hold out: those matching the rule ``holdout`` (see the module)
    and/or the ``holdout_top`` (N, D) points of largest compute (with all their
    replicates). A rule that does not parse is an ``ArgumentError`` naming ``holdout``."""
    held = np.zeros(len(N), dtype=bool)
    if holdout:
        rule = holdout
        m = _RULE.match(rule)
        if m is None:
            raise ArgumentError(
                "{holdout} {text!r}: expected QUANTITY OP NUMBER, e.g. C>=1e20 "
                "(quantities N, D, C, D/N, loss; operators >=, <=, >, <)",
                text=rule,
            )
        key, op, text = m.groups()
        try:
            value = float(text)
        except ValueError:
            raise ArgumentError(
                "{holdout} {rule!r}: {text!r} is not a number", rule=rule, text=text
            ) from None
        quantity = {"N": N, "D": D, "C": flops(N, D), "D/N": D / N, "loss": loss}[key]
        held |= _OPS[op](quantity, value)
    if holdout_top:  # the top (N, D) pairs, with every row (replicate) of each
        groups = group_ids(N, D)
        compute = np.zeros(int(groups.max()) + 1)
        compute[groups] = flops(N, D)
        largest = np.argsort(-compute, kind="stable")[:holdout_top]
        held |= np.isin(groups, largest)
    return held
