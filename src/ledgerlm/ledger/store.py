"""The ledger: one SQLite file holding what every run spent and measured.

Every write commits on its own, so a process killed mid-run leaves all completed rows
behind, and a phase row is inserted *before* its work starts, so a crash shows up as an
open phase instead of silently vanishing. WAL mode lets a reporting process read the
file while a training process is writing it.

An open phase carries a heartbeat (``beat_at``, written by ``Ledger.beat``): the last
time its process was known to be alive. ``close_open_phases`` ends the phases a killed
process left open at their last heartbeat, so their work up to then is charged; the time
between the last heartbeat and the kill is unknown and is not charged (a lower bound).

Another process may hold the file (a backup, a notebook inside a transaction): a
statement that meets its lock is retried with backoff for ``patience`` seconds, then
raises ``LedgerBusyError``. A reader (``read_only``) opens the file ``mode=ro`` and never
writes, so it still works on a full disk or a read-only mount. Every SQLite error is a
``LedgerError`` naming the file. A ledger is the record of the runs in the ``runs/``
folder beside it: an empty (0-byte) ledger beside runs is refused, never taken as new.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ledgerlm.ledger import resources
from ledgerlm.ledger.coverage import phase_coverage
from ledgerlm.ledger.target import charged, time_to_target

# 1: the first schema. 2: phases.beat_at (heartbeat of an open phase). 3:
# evaluations.consumed_json (training tokens consumed per domain at the evaluation). 4:
# steps.seconds (wall time of the update). 5: steps.at (when the update ended, epoch s).
SCHEMA_VERSION = 5
RUN_STATUSES = ("running", "reached", "not reached", "pruned", "failed")
BUSY_SLICE = 0.1  # seconds SQLite itself waits on a lock before the retry loop takes over
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
# Primary codes of a read-only open that cannot make the WAL's shared-memory file (a
# read-only folder, a full disk): READONLY (_DIRECTORY), IOERR (_SHMOPEN), CANTOPEN, FULL.
_NO_SHM = (8, 10, 13, 14)
_T = TypeVar("_T")

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


class LedgerBusyError(LedgerError):
    """Another process held the ledger's lock for longer than the ledger's patience."""


def require_ledger(
    path: Path, hint: str = "run something first", error: type[Exception] = LedgerError
) -> None:
    """Raise ``error`` (one line, "no ledger here", with ``hint``) unless ``path`` is a file."""
    if not path.is_file():
        raise error(f"{path}: no ledger here ({hint})")


def _code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def _busy(exc: sqlite3.Error) -> bool:
    """The database (or a table of it) is locked by another connection."""
    text = str(exc)
    return _code(exc) in (_SQLITE_BUSY, _SQLITE_LOCKED) or "is locked" in text or "busy" in text


def _check_file(path: Path) -> None:
    """Refuse what would be taken for a ledger wrongly: a folder, or a 0-byte file while
    ``runs/`` beside it holds runs (a new, empty ledger would forget them)."""
    if path.is_dir():
        raise LedgerError(f"{path}: is a folder, not a ledger file")
    if not path.is_file() or path.stat().st_size:
        return
    runs = path.with_name("runs")
    held = sum(1 for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else 0
    if held:
        raise LedgerError(
            f"{path}: empty (0 bytes) although {runs} holds {held} run(s): the ledger was "
            "lost or truncated; restore it from a backup, or move it away to start a new one"
        )


def _schema_problem(path: Path, found: str | None) -> str | None:
    if found is not None and not (found.isdigit() and int(found) <= SCHEMA_VERSION):
        return f"{path}: schema_version {found}, this code reads up to {SCHEMA_VERSION}"
    return None


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
    """One SQLite ledger file; cheap to open, safe to open from several processes.

    A writer (the default) creates the file and brings one of an older schema up to
    date. A reader (``read_only=True``) needs the file, opens it ``mode=ro`` (read-only
    at the SQLite level: every write is refused) and, where the WAL's shared-memory file
    cannot be made (a read-only folder, a full disk) and the log holds nothing, reads
    it as immutable. A statement meeting another process's lock is retried with backoff
    for up to ``patience`` seconds, calling ``on_busy(waited)`` before each retry, then
    raises ``LedgerBusyError``.
    """

    def __init__(
        self, path: str | Path, *, read_only: bool = False, patience: float = 30.0
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.patience = patience
        self.on_busy: Callable[[float], None] | None = None
        _check_file(self.path)
        self._conn = self._open_reader() if read_only else self._open_writer()

    # -- plumbing -----------------------------------------------------------------------

    def _connect(self, target: str, uri: bool = False) -> sqlite3.Connection:
        # Autocommit mode: single statements commit at once, multi-statement writes use
        # an explicit BEGIN IMMEDIATE so they take the write lock up front.
        try:
            conn = sqlite3.connect(target, timeout=BUSY_SLICE, isolation_level=None, uri=uri)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        conn.row_factory = sqlite3.Row
        return conn

    def _open_writer(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = conn = self._connect(str(self.path))
        try:
            self._retry(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._init_schema()
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        require_ledger(self.path)
        if not self.path.stat().st_size:
            raise LedgerError(f"{self.path}: empty (0 bytes): no run was ever recorded in it")
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        plain = self._open_plain_reader()
        if plain is not None:
            conn, found = plain
        else:
            conn, found = self._open_ro_reader(uri)
        conn.execute("PRAGMA query_only=1")
        if problem := _schema_problem(self.path, found):
            conn.close()
            raise LedgerError(problem)
        if found is None or int(found) < SCHEMA_VERSION:
            conn.close()
            try:  # an older ledger: bring it up to date once, as any writer would
                Ledger(self.path, patience=self.patience).close()
            except LedgerError as exc:
                raise LedgerError(
                    f"schema_version {found} is older than this code's {SCHEMA_VERSION} and "
                    f"bringing it up to date needs to write it: {exc}"
                ) from None
            return self._open_reader()
        return conn

    def _open_plain_reader(self) -> tuple[sqlite3.Connection, str | None] | None:
        """Where the ledger and its folder can be written, a reader is an ordinary
        connection that ``query_only`` keeps from writing: unlike a ``mode=ro`` one, its
        close removes the shared-memory and log files SQLite makes for it, so reading
        leaves the workspace as it was. ``None`` where that cannot be (a read-only mount,
        a full disk): ``mode=ro`` then."""
        if not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
            return None
        self._conn = conn = self._connect(str(self.path))
        try:
            conn.execute("PRAGMA query_only=1")
            return conn, self._schema_of(conn)
        except LedgerError as exc:
            conn.close()
            if "not a ledger" in str(exc):
                raise
            return None

    def _open_ro_reader(self, uri: str) -> tuple[sqlite3.Connection, str | None]:
        self._conn = conn = self._connect(uri, uri=True)
        try:
            found = self._schema_of(conn)
        except LedgerError as exc:
            conn.close()
            cause = getattr(exc, "sqlite", None)
            wal = self.path.with_name(self.path.name + "-wal")
            if not (isinstance(cause, sqlite3.OperationalError) and _code(cause) in _NO_SHM):
                raise
            if wal.is_file() and wal.stat().st_size:
                raise LedgerError(
                    f"{self.path}: cannot be read: its write-ahead log {wal.name} holds "
                    f"changes and no shared-memory file can be made beside it ({cause})"
                ) from None
            self._conn = conn = self._connect(f"{uri}&immutable=1", uri=True)
            found = self._schema_of(conn)
        return conn, found

    def _schema_of(self, conn: sqlite3.Connection) -> str | None:
        def read() -> str | None:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            return None if row is None else str(row["value"])

        try:
            return self._retry(read)
        except LedgerError as exc:
            if "no such table" in str(exc):
                raise LedgerError(f"{self.path}: not a ledger (it has no meta table)") from None
            raise

    def _error(self, exc: sqlite3.Error) -> LedgerError:
        """An SQLite error as one line naming the file (the error kept as ``.sqlite``)."""
        error = LedgerError(f"{self.path}: {' '.join(str(exc).split())}")
        error.sqlite = exc  # type: ignore[attr-defined]
        return error

    def _retry(self, fn: Callable[[], _T]) -> _T:
        """``fn()``, retried with backoff while another process holds the lock, for up to
        ``patience`` seconds; an SQLite error is a ``LedgerError`` naming the file."""
        began, pause = time.monotonic(), 0.05
        while True:
            try:
                return fn()
            except sqlite3.IntegrityError:
                raise  # a constraint the caller handles (an id drawn twice)
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise self._error(exc) from None
                waited = time.monotonic() - began
                if waited >= self.patience:
                    raise LedgerBusyError(
                        f"{self.path}: database is locked (by another process, for {waited:.1f} s)"
                    ) from None
                if self.on_busy is not None:
                    self.on_busy(waited)
                time.sleep(min(pause, self.patience - waited))
                pause = min(2 * pause, 1.0)
            except sqlite3.Error as exc:
                raise self._error(exc) from None

    def _exec(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        return self._retry(lambda: self._conn.execute(sql, params))

    def _rows(self, sql: str, params: tuple | list = ()) -> list[sqlite3.Row]:
        return self._retry(lambda: self._conn.execute(sql, params).fetchall())

    def _one(self, sql: str, params: tuple | list = ()) -> sqlite3.Row | None:
        return self._retry(lambda: self._conn.execute(sql, params).fetchone())

    @contextmanager
    def waiting_at_most(self, seconds: float) -> Iterator[None]:
        """Within the block, a statement meeting another process's lock waits at most
        ``seconds`` (0: one attempt, no wait) before ``LedgerBusyError``."""
        patience, self.patience = self.patience, seconds
        self._conn.execute(f"PRAGMA busy_timeout = {int(min(seconds, BUSY_SLICE) * 1000)}")
        try:
            yield
        finally:
            self.patience = patience
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SLICE * 1000)}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self._retry(lambda: self._conn.execute("BEGIN IMMEDIATE"))
        try:
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc) from None
            raise

    @contextmanager
    def together(self) -> Iterator[None]:
        """The writes of the block in one transaction: all of them, or (on any error, an
        interrupt too) none. The write lock is taken as the block starts."""
        with self._write():
            yield

    def _init_schema(self) -> None:
        """Create the tables, or bring a file written by older code up to this schema.

        One write transaction, so two processes opening an old file at once migrate it
        once; a file from newer code is refused before anything in it changes.
        """
        with self._write() as conn:
            conn.execute(_META)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if problem := _schema_problem(self.path, None if row is None else row["value"]):
                raise LedgerError(problem)
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
        if self._one("SELECT 1 FROM runs WHERE id = ?", (run_id,)) is None:
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
                self._exec(
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
        self._exec(
            "UPDATE runs SET data_version = COALESCE(?, data_version),"
            " tokens_version = COALESCE(?, tokens_version) WHERE id = ?",
            (data_version, tokens_version, run_id),
        )

    def finish_run(self, run_id: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise LedgerError(f"status must be one of {', '.join(RUN_STATUSES)}; got {status!r}")
        self._require_run(run_id)
        self._exec("UPDATE runs SET status = ? WHERE id = ?", (status, run_id))

    def list_runs(self) -> list[dict]:
        """Runs, newest first; ``last_seen`` is the latest time any phase of the run
        started, ended or beat (when its process was last known alive)."""
        rows = self._rows(
            "SELECT id, name, created_at, status, data_version, tokens_version,"
            " (SELECT MAX(MAX(started_at, COALESCE(ended_at, 0), COALESCE(beat_at, 0)))"
            "  FROM phases WHERE phases.run_id = runs.id) AS last_seen"
            " FROM runs ORDER BY created_at DESC, rowid DESC"
        )
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
        cur = self._exec(
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
            self._exec(
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
        cur = self._exec(
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
        self._exec(
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
            row = self._one("SELECT run_id FROM phases WHERE id = ?", (phase_id,))
            if row is None or row["run_id"] != run_id:
                raise LedgerError(f"phase {phase_id} does not belong to run {run_id!r}")
        # A metric that failed to compute is kept as null: visible, and never confirming.
        clean = {str(k): None if v is None else float(v) for k, v in metrics.items()}
        cur = self._exec(
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

    def add_steps(self, run_id: str, rows: list[dict[str, float]], beat: int | None = None) -> None:
        """Per-update records (tokens and targets of that update, loss, grad norm, lr, the
        update's wall time in ``seconds`` and when it ended, ``at`` in epoch seconds, when
        known); ``beat``: the id of an open phase to beat up to the last row's step, in
        the same transaction.

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
            if beat is not None:
                conn.execute(
                    "UPDATE phases SET beat_at = ?, step_end = ? WHERE id = ? AND ended_at IS NULL",
                    (time.time(), int(rows[-1]["step"]), int(beat)),
                )

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        return [
            dict(r)
            for r in self._rows(
                "SELECT step, tokens, targets, loss, grad_norm, lr, seconds, at FROM steps"
                " WHERE run_id = ? ORDER BY step",
                (run_id,),
            )
        ]

    def add_event(self, run_id: str, kind: str, message: str, step: int | None = None) -> None:
        self._require_run(run_id)
        self._exec(
            "INSERT INTO events(run_id, step, kind, message, created_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, step, kind, message, time.time()),
        )

    # -- reading ------------------------------------------------------------------------

    def run_summary(self, run_id: str) -> dict:
        """Everything known about one run, with the time-to-target verdict computed fresh.

        Each phase holds its ``device_seconds`` (wall x the devices held then, from the
        run's ``resources`` events: ``ledger.resources``); ``resources`` are those in
        force now (``None`` for a run recorded before them), ``device_seconds`` and
        ``phase_device_totals`` the run's device time, and time-to-target holds the
        device time of its bill and, where a price was in force, its cost."""
        row = self._one("SELECT * FROM runs WHERE id = ?", (run_id,))
        if row is None:
            raise LedgerError(f"no run with id {run_id!r}")
        run = dict(row)
        run["recipe"] = json.loads(run.pop("recipe_json") or "{}")
        run["meta"] = json.loads(run.pop("meta_json") or "{}")

        phases = []
        for phase_row in self._rows("SELECT * FROM phases WHERE run_id = ? ORDER BY id", (run_id,)):
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
        for eval_row in self._rows(
            "SELECT * FROM evaluations WHERE run_id = ? ORDER BY step, id", (run_id,)
        ):
            evaluation = dict(eval_row)
            evaluation["metrics"] = json.loads(evaluation.pop("metrics_json") or "{}")
            evaluation["consumed"] = json.loads(evaluation.pop("consumed_json", None) or "{}")
            evaluations.append(evaluation)

        counters = {
            r["name"]: _number(r["value"])
            for r in self._rows(
                "SELECT name, value FROM counters WHERE run_id = ? ORDER BY name", (run_id,)
            )
        }
        events = [
            dict(r)
            for r in self._rows("SELECT * FROM events WHERE run_id = ? ORDER BY id", (run_id,))
        ]
        held = resources.charge(phases, events)
        contract = run["meta"].get("contract", {})
        verdict = time_to_target(
            phases,
            evaluations,
            run["target_metric"],
            run["target_value"],
            int(contract.get("confirm", 1)),
            contract.get("targets") or {},
            contract.get("confirm_by", "threshold"),
        )
        if verdict.reached and verdict.evaluation is not None:
            ids = {p["id"] for p in charged(phases, verdict.evaluation)}
            bill = [(p, r) for p, r in zip(phases, held["by_phase"], strict=True) if p["id"] in ids]
            priced = resources.cost([p for p, _ in bill], [r for _, r in bill])
            verdict = dataclasses.replace(verdict, cost=priced)
        recorded = self._one(
            "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COALESCE(SUM(targets), 0)"
            " FROM steps WHERE run_id = ?",
            (run_id,),
        )
        return {
            "run": run,
            "phases": phases,
            "phase_totals": totals,
            "total_seconds": sum(totals.values()),
            "resources": held["resources"],
            "device_seconds": held["device_seconds"],
            "phase_device_totals": held["phase_device_totals"],
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
