"""pyarrow's implicit probe for pandas, skipped in the processes that run the data stage."""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa


class _NoPandas:
    """An import finder that refuses pandas (see ``skip_pandas_probe``)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("not while pyarrow probes for it")


def skip_pandas_probe() -> None:
    """Keep pyarrow from importing pandas in a process that never gives it pandas objects.

    pyarrow imports pandas, when installed, the first time it converts a Python list,
    only to ask whether the list is a pandas object: 0.3-0.5 s per process, measured as
    most of preparing a 1 MB corpus. This makes that first probe find no pandas. Asked
    for explicitly later (``to_pandas``, ``from_pandas``), pyarrow still imports it, and
    ``pa.table(df)`` still works; only its implicit detection of pandas values (e.g. a
    ``Categorical`` as a dictionary array) stays off. So only processes that exist to run
    the data stage call this: its workers and ``ledgerlm data prepare``.
    """
    if "pandas" in sys.modules:
        return  # already paid for, and someone uses it
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([""])
    finally:
        sys.meta_path.remove(finder)
