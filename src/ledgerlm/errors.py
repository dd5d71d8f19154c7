"""Errors about a function's arguments, worded so that a caller can name them its own way.

A library function refuses a bad argument by the argument's name (``holdout 'C=>1e20':
expected QUANTITY OP NUMBER ...``); the CLI, which took the value from a flag, words the
same error with the flag (``--holdout 'C=>1e20': ...``) in the one place it catches
errors (``cli.ui.friendly_errors``).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any


class ArgumentError(ValueError):
    """A bad argument, or a bad combination of them; the message is one line.

    ``template`` is a ``str.format`` string: each field in ``values`` is filled with its
    value, every other field is an argument's name (``{holdout}``). ``str(error)`` names
    the arguments as the function does; ``worded(names)`` as ``names`` maps them."""

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values
        super().__init__(self.worded({}))

    def arguments(self) -> list[str]:
        """The arguments the message names, in order."""
        fields = (f for _, f, _, _ in string.Formatter().parse(self.template) if f)
        return [f for f in dict.fromkeys(fields) if f not in self.values]

    def worded(self, names: Mapping[str, str]) -> str:
        """The message with each argument named as ``names`` says (else by its name)."""
        return self.template.format_map(
            {**{a: names.get(a, a) for a in self.arguments()}, **self.values}
        )
