"""Epoch AI's extraction of the Chinchilla runs, read from ../shared when present."""

from pathlib import Path

import pytest

from ledgerlm.scaling.table import TablePoints, load_epoch_chinchilla

REFERENCE_CSV = Path(__file__).resolve().parents[2] / "shared/data/chinchilla_epoch.csv"


def reference_points() -> TablePoints:
    """The 240 points Besiroglu et al. fit (5 highest losses dropped), or a skip."""
    if not REFERENCE_CSV.exists():
        pytest.skip(
            f"reference data absent: {REFERENCE_CSV} (Epoch AI's chinchilla_epoch.csv, "
            "columns 'Model Size', 'Training FLOP', 'loss')"
        )
    return load_epoch_chinchilla(REFERENCE_CSV, drop_highest_loss=5)
