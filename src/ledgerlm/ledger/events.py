"""Which of a run's events are warnings: something failed or wants a look, though the
run went on (or, for ``error``, ended). ``ledger show`` lists them in its events section;
the other events (the target contract, the mixture plan, timings) are data that other
sections render.
"""

from __future__ import annotations

from typing import Any

WARNING_EVENTS = (
    "error",  # the error that ended the run
    "interrupted",  # the signal that ended the run (Ctrl-C, SIGTERM, SIGHUP)
    "sink_failed",  # a sink dropped: the dashboard's copy stops there
    "nonfinite",  # a non-finite loss or gradient
    "loss_spike",  # an update's loss far above its running median
    "mixture_warning",  # a domain repeated more than data.mixture.max_epochs
    "contamination",  # evaluation text found in the training data
)


def warnings(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The warning events of a run's summary (``Ledger.run_summary``), in order."""
    return [e for e in summary["events"] if e["kind"] in WARNING_EVENTS]
