"""The data stage's processes skip pyarrow's implicit probe for pandas (0.3-0.5 s a
process), and can still ask for pandas explicitly."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
import pyarrow as pa
from ledgerlm.data.pandas_probe import skip_pandas_probe
skip_pandas_probe()
pa.array(["text"])
print("pandas" in sys.modules)
import pandas
print(len(pa.table(pandas.DataFrame({"a": [1, 2]}))))
"""


def test_the_probe_finds_no_pandas_and_pandas_still_imports_when_asked():
    pytest.importorskip("pandas")
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "2"]
