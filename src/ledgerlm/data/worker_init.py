"""Imported once by the fork server that starts data-stage workers (``executor``):
everything a worker needs, loaded before it is forked."""

import pyarrow.compute  # noqa: F401  (the write pass takes rows: 0.1 s to import)

from ledgerlm.data import passes  # noqa: F401  (numpy, pyarrow, the passes)
from ledgerlm.data.records import skip_pandas_probe

skip_pandas_probe()
