"""The (N, D, loss) points a scaling fit is made on, and where each came from.

``load_points`` reads them from exactly one source: a sweep or a list of runs (read back
from the ledger by ``ledgerlm.lab.sweep.sweep_points``), or a CSV table (read by
``ledgerlm.scaling.table.read_points``: its own column names, or named ones). A
``FitPoints`` keeps each point's label, learning rate and isoFLOP budget beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ledgerlm.errors import ArgumentError
from ledgerlm.workspace import DEFAULT_WORKSPACE, Workspace

PARAMS = ("forward", "total")  # what N counts: see load_points


def describe_source(source: dict[str, Any]) -> str:
    """Where points came from, in words: ``sweep <id>``, the CSV path or ``runs a, b``."""
    if "sweep" in source:
        return f"sweep {source['sweep']}"
    if "csv" in source:
        return source["csv"]
    return f"runs {', '.join(source['runs'])}"


@dataclass
class FitPoints:
    """(N, D, loss) points to fit, and where they came from; unpacks as ``N, D, loss``.

    ``source`` is ``{"sweep": id}``, ``{"runs": [refs]}`` or ``{"csv": path}``; ``labels``
    names each point (its run id, or ``line K`` of the CSV); ``runs`` one row (run, N, D,
    loss) per point read from the ledger (none from a CSV); ``skipped`` the ``[run id,
    reason]`` of the runs with no final point; ``lr`` each point's learning rate when
    known; ``budget`` each point's isoFLOP budget label when the table has one;
    ``missing`` a sweep's planned points without a result (``planned``, ``points``,
    ``line``: ``lab.sweep.missing_line``), None when none is missing or nothing was planned.
    """

    N: np.ndarray
    D: np.ndarray
    loss: np.ndarray
    source: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[list[str]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    lr: np.ndarray | None = None
    budget: np.ndarray | None = None
    columns: dict[str, str] = field(default_factory=dict)
    missing: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [f"point {i + 1}" for i in range(len(self.N))]

    def __iter__(self):
        return iter((self.N, self.D, self.loss))

    def __len__(self) -> int:
        return len(self.N)

    def distinct(self) -> int:
        """How many distinct (N, D) pairs there are (repeated seeds count once)."""
        from ledgerlm.scaling.replicates import group_ids

        return int(group_ids(self.N, self.D).max()) + 1 if len(self.N) else 0

    def describe(self) -> str:
        """Where the points came from, in words (see ``describe_source``)."""
        return describe_source(self.source)

    def select(self, keep: np.ndarray) -> FitPoints:
        """The points where ``keep`` (a boolean mask or indices) holds, in that order."""
        idx = np.arange(len(self.N))[keep]
        pick = lambda a: None if a is None else a[idx]  # noqa: E731
        return FitPoints(
            self.N[idx],
            self.D[idx],
            self.loss[idx],
            self.source,
            [self.runs[i] for i in idx] if self.runs else [],
            self.skipped,
            [self.labels[i] for i in idx],
            pick(self.lr),
            pick(self.budget),
            self.columns,
            self.missing,
        )

    def rows(self, idx: Sequence[int], why: str) -> list[dict[str, Any]]:
        """The points at ``idx`` as rows naming why they were left out."""
        return [
            {
                "point": self.labels[i],
                "N": float(self.N[i]),
                "D": float(self.D[i]),
                "loss": float(self.loss[i]),
                "why": why,
            }
            for i in idx
        ]


def load_points(
    sweep: str | None = None,
    runs: str | Sequence[str] | None = None,
    csv: str | Path | None = None,
    *,
    workspace: Workspace | str | Path = DEFAULT_WORKSPACE,
    columns: Mapping[str, str | None] | None = None,
    params: str = "forward",
) -> FitPoints:
    """(N, D, loss) from exactly one source: a sweep (id, unique prefix or ``latest``),
    runs (ids or unique prefixes; a string is split on commas) or a CSV table.

    Sweeps and runs are read from the workspace's ledger: N as the sweep plan counts it
    (``params="forward"``: the weights the forward pass multiplies by, the N of C = 6ND)
    or every parameter with the token embedding (``"total"``), D the tokens each run
    consumed, loss its final validation loss. A CSV's columns are found by name or named
    in ``columns`` (keys n_col, d_col, c_col, loss_col, lr_col, budget_col; a named
    column with a sweep or runs is an ``ArgumentError``, as is no source or several)."""
    if sum(1 for v in (sweep, runs, csv) if v) != 1:
        raise ArgumentError(
            "give exactly one source of points: {sweep} ID, {runs} R1,R2,... or {csv} FILE"
        )
    if params not in PARAMS:
        raise ValueError(f"params must be one of {', '.join(PARAMS)}, got {params!r}")
    named = [k for k, v in (columns or {}).items() if v is not None]
    if named and csv is None:
        raise ArgumentError(f"{{{named[0]}}} applies to {{csv}} only")
    if csv is not None:
        from ledgerlm.scaling.table import read_points

        path = Path(csv)
        table = read_points(path, **{k: (columns or {})[k] for k in named})
        return FitPoints(
            table.N,
            table.D,
            table.loss,
            {"csv": str(path)},
            labels=[f"line {n}" for n in table.lines],
            lr=table.lr,
            budget=table.budget,
            columns=table.columns,
        )

    from ledgerlm.lab.sweep import sweep_points
    from ledgerlm.ledger.store import Ledger, require_ledger

    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    require_ledger(ws.ledger_path, "run a sweep first", FileNotFoundError)
    with Ledger(ws.ledger_path) as ledger:
        if sweep:
            found = sweep_points(ledger, sweep, ws)
            source: dict[str, Any] = {"sweep": found.sweep_id}
        else:
            items = runs.split(",") if isinstance(runs, str) else runs
            refs = [r.strip() for r in items if r.strip()]
            found = sweep_points(ledger, refs, ws)
            source = {"runs": refs}
    N = found.N_total if params == "total" else found.N
    columns = {
        "N": "every parameter" if params == "total" else "forward parameters (C = 6ND)",
        "D": "tokens consumed",
        "loss": "final validation loss",
    }
    rows = found.rows()
    line = found.missing_line()
    missing = None
    if line is not None:
        missing = {"planned": found.planned, "points": found.missing, "line": line}
    if params == "total":
        rows = [{**r, "N": int(n)} for r, n in zip(rows, N, strict=True)]
    return FitPoints(
        np.asarray(N, dtype=np.float64),
        np.asarray(found.D, dtype=np.float64),
        np.asarray(found.loss, dtype=np.float64),
        source,
        rows,
        [list(s) for s in found.skipped],
        list(found.runs),
        found.lr,
        columns=columns,
        missing=missing,
    )
