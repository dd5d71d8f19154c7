"""Imported once by the fork server that starts data-stage workers (``executor``):
everything a worker needs, loaded before it is forked; and the server's tie to the
process that started it, so that it dies with it (``executor.die_with_parent``)."""

import psutil  # noqa: F401  (each worker's watchdog, ``executor._start_worker``)
import pyarrow.compute  # noqa: F401  (the write pass takes rows: 0.1 s to import)

from ledgerlm.data import passes  # noqa: F401  (numpy, pyarrow, the passes, the readers they call)
from ledgerlm.data.executor import die_with_parent
from ledgerlm.data.pandas_probe import skip_pandas_probe

die_with_parent()
skip_pandas_probe()
