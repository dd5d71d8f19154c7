"""A run's sinks, built from its recipe's ``[log]`` section, and a run replayed from the
ledger into one after the fact (``ledgerlm ledger export``).

Only the process that writes the ledger opens sinks: rank 0 (the others never build a
``LedgerRecorder``). A run checks its sinks' libraries with its other inputs, before the
run or the ledger exists (``check_sinks``); the live sinks are opened once the run holds
its lock, each saying where its copy goes through the recorder's ``note``, and closed
when it ends, normally or not (``lab.skeleton.failing``).

Files go to ``log.dir``: by default the run's own ``<run dir>/logs`` (TensorBoard's
event files there, W&B's under ``logs/wandb/``); a folder named in the recipe, which
several runs may share, gets a subfolder per run id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerlm.config import LogConfig, Recipe, settings_in_effect
from ledgerlm.ledger.coverage import update_times
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.sinks import (
    KINDS,
    MLflowSink,
    Sink,
    SinkError,
    TensorBoardSink,
    WandbSink,
    check_sink,
    failure_line,
    final_scalars,
)
from ledgerlm.workspace import Workspace

if TYPE_CHECKING:
    from ledgerlm.lab.recorder import LedgerRecorder


def log_dir(log: LogConfig, run_dir: Path, run_id: str) -> Path:
    """Where a run's TensorBoard and W&B files go (see the module's docstring)."""
    return run_dir / "logs" if log.dir is None else Path(log.dir).expanduser() / run_id


def opener(
    kind: str,
    run_id: str,
    log: LogConfig,
    folder: Path,
    *,
    live: bool,
    started_at: float | None = None,
) -> Callable[[], Sink]:
    """How to open the ``kind`` sink of ``run_id``: ``live`` for the copy made while it
    trains (a resume continues it), else its export (a second export updates the first;
    a new MLflow run starts at ``started_at``)."""
    source = "training" if live else "export"
    if kind == "tensorboard":
        return lambda: TensorBoardSink(folder)
    if kind == "mlflow":
        return lambda: MLflowSink(
            run_id,
            uri=log.mlflow_uri,
            experiment=log.mlflow_experiment,
            source=source,
            started_at=started_at,
        )
    if kind == "wandb":
        return lambda: WandbSink(
            run_id, project=log.wandb_project, folder=folder, mode=log.wandb_mode, source=source
        )
    raise SinkError(f"unknown sink {kind!r} (sinks: {', '.join(KINDS)})")


def check_sinks(recipe: Recipe) -> None:
    """Refuse a recipe whose sink's library is missing, naming the extra (``SinkError``),
    before anything is written: the run would otherwise train with no copy."""
    for kind in dict.fromkeys(recipe.log.sinks):
        check_sink(kind, "log.sinks")


def open_sinks(recorder: LedgerRecorder, recipe: Recipe, run_dir: Path) -> None:
    """Open the sinks ``recipe.log.sinks`` names for the recorder's run, say where each
    copy goes (``recorder.note``: its place, then the command that shows it) and send
    them the recipe; one that cannot be opened is a ``sink_failed`` event and a warning,
    not an error."""
    log = recipe.log
    if not log.sinks:
        return
    folder = log_dir(log, run_dir, recorder.run_id)
    for kind in dict.fromkeys(log.sinks):
        sink = recorder.sinks.open(kind, opener(kind, recorder.run_id, log, folder, live=True))
        if sink is not None:
            recorder.note(f"{sink.name} sink: {sink.where}")
            if sink.view:
                recorder.note(sink.view)
    recorder.sinks.log_params(settings_in_effect(recipe.to_dict()))


def replay(ledger: Ledger, run_id: str, sink: Sink) -> dict[str, int]:
    """Send ``sink`` the run's recipe, then its updates and evaluations in step order (an
    evaluation after the update it follows), each with its time in the ledger, then its
    final wall and device seconds (``final_scalars``) at its end; the counts sent."""
    summary = ledger.run_summary(run_id)
    sink.log_params(settings_in_effect(summary["run"]["recipe"]))
    rows, evaluations = ledger.steps(run_id), summary["evaluations"]
    for row, at in zip(rows, update_times(rows, summary["phases"]), strict=True):
        row["at"] = at  # as stored, or placed in its train phase (an older ledger)
    order = sorted(
        [(r["step"], 0, i) for i, r in enumerate(rows)]
        + [(e["step"], 1, i) for i, e in enumerate(evaluations)]
    )
    for _, kind, i in order:
        if kind == 0:
            sink.log_step(rows[i])
        else:
            sink.log_evaluation(evaluations[i])
    values, step = final_scalars(summary)
    sink.log_summary(values, step, run_span(summary)[1])
    sink.flush()
    return {"steps": len(rows), "evaluations": len(evaluations)}


def _stored_log(recipe: dict[str, Any]) -> LogConfig:
    """The ``[log]`` section the run stored (defaults if it had none or it no longer
    validates: an export must not depend on the code that trained the run)."""
    try:
        return LogConfig.model_validate(recipe.get("log") or {})
    except ValueError:
        return LogConfig()


def run_span(summary: dict[str, Any]) -> tuple[float, float]:
    """When a run began and ended (epoch seconds), as its ledger rows say: its creation
    or its first phase (the command's start-up), and the end of its last phase."""
    run, phases = summary["run"], summary["phases"]
    began = min([float(run["created_at"])] + [float(p["started_at"]) for p in phases])
    ends = [p["ended_at"] if p["ended_at"] is not None else p.get("beat_at") for p in phases]
    return began, max([began] + [float(e) for e in ends if e is not None])


def replay_to_sinks(
    ledger: Ledger, workspace: Workspace, run_ref: str, to: str, dest: str | None = None
) -> dict[str, Any]:
    """Replay run ``run_ref`` (an id, a unique part, or ``latest``) from the ledger into
    its ``to`` copy: TensorBoard event files in ``dest``/<run id> (a folder is needed);
    an MLflow run at tracking URI ``dest`` (default: the recipe's ``log.mlflow_uri``,
    else ``MLFLOW_TRACKING_URI`` or MLflow's own); a W&B run whose files go under
    ``dest`` (default: the run's log folder in ``workspace``). The experiment, project
    and W&B mode are the run's stored ``[log]``. A second export to MLflow or W&B
    updates the run the first made; every point keeps its time in the ledger.

    Returns the run id, the sink, where the copy went (and the command that shows it)
    and the counts sent. A missing library and any fault of the sink are a one-line
    ``SinkError``."""
    check_sink(to, "--to")
    run_id = ledger.resolve_run(run_ref)
    summary = ledger.run_summary(run_id)
    began, ended = run_span(summary)
    log = _stored_log(summary["run"]["recipe"])
    if to == "tensorboard":
        if not dest:
            raise SinkError("a TensorBoard export needs a folder to write its event files in")
        folder = Path(dest).expanduser() / run_id
    elif to == "wandb" and dest:
        folder = Path(dest).expanduser()
    else:
        folder = log_dir(log, workspace.run_dir(run_id), run_id)
    if to == "mlflow" and dest:
        log = log.model_copy(update={"mlflow_uri": dest})
    try:
        sink = opener(to, run_id, log, folder, live=False, started_at=began)()
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(failure_line(to, exc)) from exc
    status = summary["run"]["status"]
    try:
        counts = replay(ledger, run_id, sink)
    except Exception as exc:
        with contextlib.suppress(Exception):  # the replay's error is the one to report
            sink.close("failed")
        raise SinkError(failure_line(to, exc)) from exc
    try:
        sink.close(status, ended_at=ended)
    except Exception as exc:
        raise SinkError(failure_line(to, exc)) from exc
    where = {"where": sink.where, "view": sink.view}
    return {"run": run_id, "sink": to, **where, "status": status, **counts}
