"""Splits by time (requirement D7, ``data.split = "time"``): the future is held out.

A document's date travels through the passes as one int64, microseconds since
1970-01-01 UTC (``UNDATED`` for a document without one), beside its digest and
rank; the driver decides from those numbers alone, never from text:

- a cluster (a document with its exact and near duplicates) is held out when its
  earliest dated member is on or after ``data.split_time``, and goes to train
  otherwise, so no cluster straddles the cut; undated members do not vote, and a
  cluster with no dated member goes to train;
- a held-out cluster joins val or test by the hash draw ``u`` of its keeper's id
  (the draw of ``split_of``): val if ``u < val_fraction / (val_fraction +
  test_fraction)``, else test; without a test split every held-out cluster is val.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import numpy as np

from ledgerlm.config import DataConfig, parse_time

UNDATED = np.iinfo(np.int64).max

METHOD = (
    "by date: a cluster is held out when its earliest dated member is on or after "
    "split_time (UTC when the date names no zone; undated members do not count, a "
    "cluster without a dated member is train), else train; a held-out cluster is val if "
    "u < val_fraction / (val_fraction + test_fraction) for u the hash of its key in "
    "[0, 1), else test"
)


def document_times(dates: Iterable[str | None]) -> np.ndarray:
    """The int64 time of each date (``parse_time``; the reader has checked them)."""
    return np.array([UNDATED if d is None else parse_time(d) for d in dates], dtype=np.int64)


def val_share(cfg: DataConfig) -> float:
    """The share of held-out clusters that go to val (the rest go to test)."""
    val_fraction, test_fraction = cfg.drawn_fractions()
    return val_fraction / (val_fraction + test_fraction)


def held_out(labels: np.ndarray, times: np.ndarray, cut: int) -> np.ndarray:
    """Per document: whether its cluster (``labels``) is held out, i.e. whether the
    earliest dated member of the cluster is on or after ``cut``."""
    labels = np.asarray(labels, dtype=np.int64)
    earliest = np.full(len(labels), UNDATED, dtype=np.int64)
    np.minimum.at(earliest, labels, times)
    first = earliest[labels]
    return (first != UNDATED) & (first >= cut)


def summary(cfg: DataConfig, times: np.ndarray, held: np.ndarray, kept: np.ndarray) -> dict:
    """The manifest's account of the cut: where it is and the kept documents that the
    cluster rule kept in train although they are dated on or after it."""
    cut = cfg.split_cut()
    assert cut is not None
    after = (times != UNDATED) & (times >= cut)
    return {
        "split_time": cfg.split_time,
        "cut_utc": iso_utc(cut),
        "val_share": val_share(cfg),
        "held_out_documents": int((held & kept).sum()),
        "train_dated_after_cut": int((after & ~held & kept).sum()),
    }


def iso_utc(micros: int) -> str:
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return moment.isoformat()


def undated_text(undated: dict[str, int]) -> str:
    """``12 (train)``, or ``12 (train 11, val 1)`` when a cluster took some out."""
    total = sum(undated.values())
    where = [(s, n) for s, n in undated.items() if n]
    if len(where) <= 1:
        return f"{total:,} ({where[0][0] if where else 'train'})"
    return f"{total:,} (" + ", ".join(f"{s} {n:,}" for s, n in where) + ")"


def inspect_lines(manifest: dict[str, Any]) -> list[str]:
    """What ``data inspect`` says of a time split (nothing for other splits)."""
    time = manifest.get("split", {}).get("time")
    if not time:
        return []
    lines = [  # (each line fits in 80 columns)
        f"split by time: held out on or after {time['split_time']} ({time['cut_utc']})",
        f"undated: {undated_text(time['undated'])}",
    ]
    if time["train_dated_after_cut"]:
        lines.append(
            f"  {time['train_dated_after_cut']:,} dated on or after it in train: with an "
            "earlier duplicate"
        )
    return lines
