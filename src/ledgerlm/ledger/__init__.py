"""The run ledger: an append-only SQLite record of what a training run spent."""

from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.ledger.target import TimeToTarget, time_to_target

__all__ = ["Ledger", "LedgerError", "TimeToTarget", "time_to_target"]
