"""Fixtures of the scaling tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def law_csv(tmp_path_factory):
    """Points of a known law: enough distinct (N, D) for a fit."""
    path = tmp_path_factory.mktemp("law") / "law.csv"
    rows = ["N,D,loss"]
    for n in (1e6, 3e6, 1e7, 3e7):
        for d in (1e8, 1e9, 1e10):
            rows.append(f"{n:g},{d:g},{1.7 + 400 * n**-0.34 + 410 * d**-0.28:.6f}")
    path.write_text("\n".join(rows) + "\n")
    return path
