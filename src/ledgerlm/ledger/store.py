"""The ledger: one SQLite file holding what every run spent and measured.

Every write commits on its own, so a process killed mid-run leaves all completed rows
behind, and a phase row is inserted *before* its work starts, so a crash shows up as an
open phase instead of silently vanishing. WAL mode lets a reporting process read the
file while a training process is writing it.

An open phase carries a heartbeat (``beat_at``, written by ``Ledger.beat``): the last
time its process was known to be alive. ``close_open_phases`` ends the phases a killed
process left open at their last heartbeat, so their work up to then is charged; the time
between the last heartbeat and the kill is unknown and is not charged (a lower bound).
"""

from __future__ import annotations

import difflib
import json
import math
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from ledgerlm.ledger.coverage import phase_coverage
from ledgerlm.ledger.target import time_to_target

# 1: the first schema. 2: phases.beat_at (heartbeat of an open phase). 3:
# evaluations.consumed_json (training tokens consumed per domain at the evaluation). 4:
# steps.seconds (wall time of the update). 5: steps.at (when the update ended, epoch s).
SCHEMA_VERSION = 5
RUN_STATUSES = ("running", "reached", "not reached", "failed")

_META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)"
_SCHEMA = f"""
{_META};
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT, created_at REAL, status TEXT, recipe_json TEXT,
    data_version TEXT, tokens_version TEXT, target_metric TEXT, target_value REAL,
    eval_every INTEGER, meta_json TEXT
);
CREATE TABLE IF NOT EXISTS phases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id), kind TEXT,
    started_at REAL, ended_at REAL NULL, seconds REAL NULL, step_start INTEGER NULL,
    step_end INTEGER NULL, detail_json TEXT, beat_at REAL NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id),
    phase_id INTEGER REFERENCES phases(id), step INTEGER, tokens INTEGER, targets INTEGER,
    updates INTEGER, snapshot TEXT, metrics_json TEXT, created_at REAL
);
CREATE TABLE IF NOT EXISTS counters (
    run_id TEXT REFERENCES runs(id), name TEXT, value REAL, PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT REFERENCES runs(id), step INTEGER, tokens INTEGER, targets INTEGER,
    loss REAL, grad_norm REAL, lr REAL, PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT REFERENCES runs(id),
    step INTEGER NULL, kind TEXT, message TEXT, created_at REAL
);
CREATE INDEX IF NOT EXISTS phases_run ON phases(run_id, id);
CREATE INDEX IF NOT EXISTS evaluations_run ON evaluations(run_id, step, id);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id, id);
"""

# Columns added after schema version 1, as (table, column, declaration): a file written
# by older code gets them (NULL in its existing rows) the first time newer code opens it.
_ADDED_COLUMNS = (
    ("phases", "beat_at", "REAL NULL"),
    ("evaluations", "consumed_json", "TEXT NULL"),
    ("steps", "seconds", "REAL NULL"),
    ("steps", "at", "REAL NULL"),
)


class LedgerError(Exception):
    """A ledger request that cannot be honoured; the message is one line."""


def _json_default(obj: Any) -> Any:
    # Training code hands over numpy/torch scalars; a ledger write must not crash a run
    # over a detail's type, so scalars become Python numbers and the rest text.
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(obj)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default)


def _number(value: float) -> float | int:
    # Counters are stored as REAL; show whole numbers as ints so token counts read naturally.
    return int(value) if isinstance(value, float) and value.is_integer() else value


@dataclass
class OpenPhase:
    """Handle yielded by ``Ledger.phase``; the caller may fill ``detail`` and ``step_end``."""

    id: int
    run_id: str
    kind: str
    step_start: int | None = None
    step_end: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Ledger:
    """One SQLite ledger file; cheap to open, safe to open from several processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: single statements commit at once, multi-statement writes use
        # an explicit BEGIN IMMEDIATE so they take the write lock up front.
        self._conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._init_schema()
        except sqlite3.Error as exc:  # read-only, full, locked too long, not a database
            self._conn.close()
            raise LedgerError(f"{self.path}: cannot open the ledger for writing ({exc})") from None

    # -- plumbing -----------------------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _init_schema(self) -> None:
        """Create the tables, or bring a file written by older code up to this schema.

        One write transaction, so two processes opening an old file at once migrate it
        once; a file from newer code is refused before anything in it changes.
        """
        with self._write() as conn:
            conn.execute(_META)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            found = None if row is None else row["value"]
            if found is not None and not (found.isdigit() and int(found) <= SCHEMA_VERSION):
                raise LedgerError(
                    f"{self.path}: schema_version {found}, this code reads up to {SCHEMA_VERSION}"
                )
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            for table, column, declaration in _ADDED_COLUMNS:
                have = {r["name"] for r in conn.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            conn.execute(
                "INSERT INTO meta(key, value) VALUES ('schema_version', ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def _require_run(self, run_id: str) -> None:
        if self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise LedgerError(f"no run with id {run_id!r}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        recipe: dict,
        *,
        target_metric: str,
        target_value: float,
        eval_every: int,
        data_version: str | None = None,
        tokens_version: str | None = None,
        meta: dict | None = None,
    ) -> str:
        """Register a run as ``running``; the id embeds the UTC start so ids sort by time."""
        if not name:
            raise LedgerError("run name must not be empty")
        if not target_metric:
            raise LedgerError("target_metric must not be empty")
        if not math.isfinite(target_value):
            raise LedgerError(f"target_value must be finite, got {target_value!r}")
        if eval_every < 1:
            raise LedgerError(f"eval_every must be >= 1, got {eval_every}")
        recipe_json, meta_json = _dumps(recipe), _dumps(meta or {})
        for _ in range(100):
            now = time.time()
            stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S")
            run_id = f"{name}-{stamp}-{secrets.token_hex(2)}"
            try:
                self._conn.execute(
                    "INSERT INTO runs(id, name, created_at, status, recipe_json, data_version,"
                    " tokens_version, target_metric, target_value, eval_every, meta_json)"
                    " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        name,
                        now,
                        recipe_json,
                        data_version,
                        tokens_version,
                        target_metric,
                        float(target_value),
                        int(eval_every),
                        meta_json,
                    ),
                )
            except sqlite3.IntegrityError:
                continue  # the 4 hex chars collided within the same second; draw again
            return run_id
        raise LedgerError(f"could not allocate a unique id for run {name!r}")

    def set_versions(
        self, run_id: str, data_version: str | None = None, tokens_version: str | None = None
    ) -> None:
        """Fill in versions known only after the data/tokenize stages; ``None`` keeps a value."""
        self._require_run(run_id)
        self._conn.execute(
            "UPDATE runs SET data_version = COALESCE(?, data_version),"
            " tokens_version = COALESCE(?, tokens_version) WHERE id = ?",
            (data_version, tokens_version, run_id),
        )

    def finish_run(self, run_id: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise LedgerError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")
        self._require_run(run_id)
        self._conn.execute("UPDATE runs SET status = ? WHERE id = ?", (status, run_id))

    def list_runs(self) -> list[dict]:
        """Runs, newest first; ``last_seen`` is the latest time any phase of the run
        started, ended or beat (when its process was last known alive)."""
        rows = self._conn.execute(
            "SELECT id, name, created_at, status, data_version, tokens_version,"
            " (SELECT MAX(MAX(started_at, COALESCE(ended_at, 0), COALESCE(beat_at, 0)))"
            "  FROM phases WHERE phases.run_id = runs.id) AS last_seen"
            " FROM runs ORDER BY created_at DESC, rowid DESC"
        ).fetchall()
        return [dict(row) for row in rows]

    def resolve_run(self, ref: str) -> str:
        """Turn what a user typed into one run id: an id, ``latest``, or a part of one id
        (a unique prefix first, else a unique substring). No match names the closest
        ids; several name the matches, newest first."""
        runs = [row["id"] for row in self.list_runs()]
        if ref in runs:
            return ref
        if ref == "latest":
            if not runs:
                raise LedgerError("no runs in the ledger yet")
            return runs[0]
        matches = [run_id for run_id in runs if ref and run_id.startswith(ref)]
        if not matches:
            matches = [run_id for run_id in runs if ref and ref in run_id]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            close = difflib.get_close_matches(ref, runs, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise LedgerError(f"no run matches {ref!r}{hint}")
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise LedgerError(f"{ref!r} matches {len(matches)} runs: {shown}")

    # -- phases, evaluations, counters, events ------------------------------------------

    @contextmanager
    def phase(
        self, run_id: str, kind: str, *, step_start: int | None = None, **detail: Any
    ) -> Iterator[OpenPhase]:
        """Time a block of work; the row exists (open) before the work starts."""
        self._require_run(run_id)
        started_at = time.time()
        cur = self._conn.execute(
            "INSERT INTO phases(run_id, kind, started_at, step_start, detail_json)"
            " VALUES (?, ?, ?, ?, ?)",
            (run_id, kind, started_at, step_start, _dumps(detail)),
        )
        handle = OpenPhase(
            id=int(cur.lastrowid),
            run_id=run_id,
            kind=kind,
            step_start=step_start,
            detail=dict(detail),
        )
        t0 = time.perf_counter()
        try:
            yield handle
        except BaseException as exc:
            handle.detail["error"] = repr(exc)
            raise
        finally:
            seconds = time.perf_counter() - t0
            self._conn.execute(
                "UPDATE phases SET ended_at = ?, seconds = ?, step_end = ?, detail_json = ?"
                " WHERE id = ?",
                (time.time(), seconds, handle.step_end, _dumps(handle.detail), handle.id),
            )

    def record_phase(
        self,
        run_id: str,
        kind: str,
        seconds: float,
        *,
        step_start: int | None = None,
        step_end: int | None = None,
        detail: dict | None = None,
    ) -> int:
        """A phase whose duration is already known; it is taken to have just ended."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise LedgerError(f"phase seconds must be finite and >= 0, got {seconds!r}")
        self._require_run(run_id)
        ended_at = time.time()
        cur = self._conn.execute(
            "INSERT INTO phases(run_id, kind, started_at, ended_at, seconds, step_start,"
            " step_end, detail_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                kind,
                ended_at - seconds,
                ended_at,
                float(seconds),
                step_start,
                step_end,
                _dumps(detail or {}),
            ),
        )
        return int(cur.lastrowid)

    def beat(self, phase_id: int, step: int | None = None) -> None:
        """Heartbeat of an open phase: its process is alive now (one cheap UPDATE).

        ``step``, when given, is the last step the phase has completed, kept as its
        ``step_end`` so a phase later closed at this beat covers the right updates. A
        phase that has already ended is left as it is.
        """
        self._conn.execute(
            "UPDATE phases SET beat_at = ?, step_end = COALESCE(?, step_end)"
            " WHERE id = ? AND ended_at IS NULL",
            (time.time(), step, int(phase_id)),
        )

    def close_open_phases(self, run_id: str, reason: str) -> list[dict[str, Any]]:
        """End every phase of ``run_id`` left open by a process that died (kill -9, power
        loss) at its last heartbeat, or at its start when it never beat.

        Each gets ``ended_at``, ``seconds = ended_at - started_at`` and, in its detail,
        ``{"closed_by": reason, "killed": true}``; the closed rows are returned (as in
        ``run_summary``). The time between the last heartbeat and the death is unknown
        and is not charged, so the phase's seconds are a lower bound. Call it only while
        no live process owns the run (e.g. holding the run's lock, before resuming it):
        a live process's open phase would be cut short.
        """
        self._require_run(run_id)
        closed = []
        with self._write() as conn:
            rows = conn.execute(
                "SELECT * FROM phases WHERE run_id = ? AND ended_at IS NULL ORDER BY id",
                (run_id,),
            ).fetchall()
            for row in rows:
                phase = dict(row)
                started = float(phase["started_at"])
                beat = phase["beat_at"]
                ended = started if beat is None else max(started, float(beat))
                detail = json.loads(phase.pop("detail_json") or "{}")
                detail.update(closed_by=reason, killed=True)
                conn.execute(
                    "UPDATE phases SET ended_at = ?, seconds = ?, detail_json = ? WHERE id = ?",
                    (ended, ended - started, _dumps(detail), phase["id"]),
                )
                phase.update(ended_at=ended, seconds=ended - started, detail=detail)
                closed.append(phase)
        return closed

    def add_evaluation(
        self,
        run_id: str,
        *,
        step: int,
        tokens: int,
        targets: int,
        updates: int,
        metrics: dict[str, float],
        snapshot: str,
        phase_id: int | None,
        consumed: dict[str, int] | None = None,
    ) -> int:
        """Record an evaluation; binding it to its eval phase is what bounds time-to-target.

        ``consumed`` is the training tokens consumed per domain up to it, so the
        mixture a run really saw is known per evaluation interval."""
        self._require_run(run_id)
        if phase_id is not None:
            row = self._conn.execute(
                "SELECT run_id FROM phases WHERE id = ?", (phase_id,)
            ).fetchone()
            if row is None or row["run_id"] != run_id:
                raise LedgerError(f"phase {phase_id} does not belong to run {run_id!r}")
        # A metric that failed to compute is kept as null: visible, and never confirming.
        clean = {str(k): None if v is None else float(v) for k, v in metrics.items()}
        cur = self._conn.execute(
            "INSERT INTO evaluations(run_id, phase_id, step, tokens, targets, updates, snapshot,"
            " metrics_json, consumed_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                phase_id,
                int(step),
                int(tokens),
                int(targets),
                int(updates),
                snapshot,
                json.dumps(clean),
                None if consumed is None else json.dumps({k: int(v) for k, v in consumed.items()}),
                time.time(),
            ),
        )
        return int(cur.lastrowid)

    def set_counters(self, run_id: str, counters: dict[str, float]) -> None:
        self._require_run(run_id)
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO counters(run_id, name, value) VALUES (?, ?, ?)"
                " ON CONFLICT(run_id, name) DO UPDATE SET value = excluded.value",
                [(run_id, str(name), float(value)) for name, value in counters.items()],
            )

    def add_steps(self, run_id: str, rows: list[dict[str, float]]) -> None:
        """Per-update records (tokens and targets of that update, loss, grad norm, lr, the
        update's wall time in ``seconds`` and when it ended, ``at`` in epoch seconds, when
        known).

        Callers buffer rows and write them in one transaction per evaluation interval,
        so recording every update costs one commit per interval, not per step.
        """
        if not rows:
            return
        self._require_run(run_id)
        with self._write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO steps(run_id, step, tokens, targets, loss, grad_norm, lr,"
                " seconds, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        int(r["step"]),
                        int(r["tokens"]),
                        int(r["targets"]),
                        float(r["loss"]),
                        float(r["grad_norm"]),
                        float(r["lr"]),
                        None if r.get("seconds") is None else float(r["seconds"]),
                        None if r.get("at") is None else float(r["at"]),
                    )
                    for r in rows
                ],
            )

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return [
            dict(r)
            for r in self._conn.execute(
                "SELECT step, tokens, targets, loss, grad_norm, lr, seconds, at FROM steps"
                " WHERE run_id = ? ORDER BY step",
                (run_id,),
            )
        ]

    def add_event(self, run_id: str, kind: str, message: str, step: int | None = None) -> None:
        self._require_run(run_id)
        self._conn.execute(
            "INSERT INTO events(run_id, step, kind, message, created_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, step, kind, message, time.time()),
        )

    # -- reading ------------------------------------------------------------------------

    def run_summary(self, run_id: str) -> dict:
        """Everything known about one run, with the time-to-target verdict computed fresh."""
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise LedgerError(f"no run with id {run_id!r}")
        run = dict(row)
        run["recipe"] = json.loads(run.pop("recipe_json") or "{}")
        run["meta"] = json.loads(run.pop("meta_json") or "{}")

        phases = []
        for phase_row in self._conn.execute(
            "SELECT * FROM phases WHERE run_id = ? ORDER BY id", (run_id,)
        ):
            phase = dict(phase_row)
            phase["detail"] = json.loads(phase.pop("detail_json") or "{}")
            phases.append(phase)
        # Open phases (a live run, or a killed one not yet closed) count 0 s in every
        # total until they end; how many there are is reported so that shows.
        open_phases = sum(1 for phase in phases if phase["ended_at"] is None)
        totals: dict[str, float] = {}
        for phase in phases:
            totals[phase["kind"]] = totals.get(phase["kind"], 0.0) + (phase["seconds"] or 0.0)

        evaluations = []
        for eval_row in self._conn.execute(
            "SELECT * FROM evaluations WHERE run_id = ? ORDER BY step, id", (run_id,)
        ):
            evaluation = dict(eval_row)
            evaluation["metrics"] = json.loads(evaluation.pop("metrics_json") or "{}")
            evaluation["consumed"] = json.loads(evaluation.pop("consumed_json", None) or "{}")
            evaluations.append(evaluation)

        counters = {
            r["name"]: _number(r["value"])
            for r in self._conn.execute(
                "SELECT name, value FROM counters WHERE run_id = ? ORDER BY name", (run_id,)
            )
        }
        events = [
            dict(r)
            for r in self._conn.execute(
                "SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,)
            )
        ]
        contract = run["meta"].get("contract", {})
        verdict = time_to_target(
            phases,
            evaluations,
            run["target_metric"],
            run["target_value"],
            int(contract.get("confirm", 1)),
            contract.get("targets") or {},
        )
        recorded = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COALESCE(SUM(targets), 0)"
            " FROM steps WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        return {
            "run": run,
            "phases": phases,
            "phase_totals": totals,
            "total_seconds": sum(totals.values()),
            "open_phases": open_phases,
            "coverage": phase_coverage(run["created_at"], phases),
            "counters": counters,
            "evaluations": evaluations,
            "events": events,
            "steps_recorded": {
                "updates": recorded[0],
                "tokens": recorded[1],
                "targets": recorded[2],
            },
            "time_to_target": verdict.to_dict(),
        }
