"""A run's sinks, built from its recipe's ``[log]`` section, and a run replayed from the
ledger into one after the fact (``ledgerlm ledger export``).

Only the process that writes the ledger opens sinks: rank 0 (the others never build a
``LedgerRecorder``). The live sinks are opened once the run holds its lock and closed
when it ends, normally or not (``lab.run.failing``).

Files go to ``log.dir``: by default the run's own ``<run dir>/logs`` (TensorBoard's
event files there, W&B's under ``logs/wandb/``); a folder named in the recipe, which
several runs may share, gets a subfolder per run id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from ledgerlm.config import LogConfig, Recipe, settings_in_effect
from ledgerlm.ledger.store import Ledger
from ledgerlm.report.sinks import (
    MLflowSink,
    Sink,
    SinkError,
    TensorBoardSink,
    WandbSink,
    failure_line,
)
from ledgerlm.workspace import Workspace

if TYPE_CHECKING:
    from ledgerlm.lab.recorder import LedgerRecorder

KINDS: tuple[str, ...] = get_args(get_args(LogConfig.model_fields["sinks"].annotation)[0])


def log_dir(log: LogConfig, run_dir: Path, run_id: str) -> Path:
    """Where a run's TensorBoard and W&B files go (see the module's docstring)."""
    return run_dir / "logs" if log.dir is None else Path(log.dir).expanduser() / run_id


def opener(
    kind: str, run_id: str, log: LogConfig, folder: Path, *, live: bool
) -> Callable[[], Sink]:
    """How to open the ``kind`` sink of ``run_id``: ``live`` for the copy made while it
    trains (a resume continues it), else an export (always a fresh copy)."""
    if kind == "tensorboard":
        return lambda: TensorBoardSink(folder)
    if kind == "mlflow":
        return lambda: MLflowSink(
            run_id, uri=log.mlflow_uri, experiment=log.mlflow_experiment, resume=live
        )
    if kind == "wandb":
        return lambda: WandbSink(
            run_id, project=log.wandb_project, folder=folder, mode=log.wandb_mode, resume=live
        )
    raise SinkError(f"unknown sink {kind!r} (sinks: {', '.join(KINDS)})")


def open_sinks(recorder: LedgerRecorder, recipe: Recipe, run_dir: Path) -> None:
    """Open the sinks ``recipe.log.sinks`` names for the recorder's run and send them the
    recipe; one that cannot be opened is a ``sink_failed`` event, not an error."""
    log = recipe.log
    if not log.sinks:
        return
    folder = log_dir(log, run_dir, recorder.run_id)
    for kind in dict.fromkeys(log.sinks):
        recorder.sinks.open(kind, opener(kind, recorder.run_id, log, folder, live=True))
    recorder.sinks.log_params(settings_in_effect(recipe.to_dict()))


def replay(ledger: Ledger, run_id: str, sink: Sink) -> dict[str, int]:
    """Send ``sink`` the run's recipe, then its updates and evaluations in step order (an
    evaluation after the update it follows); the counts sent."""
    summary = ledger.run_summary(run_id)
    sink.log_params(settings_in_effect(summary["run"]["recipe"]))
    rows, evaluations = ledger.steps(run_id), summary["evaluations"]
    order = sorted(
        [(r["step"], 0, i) for i, r in enumerate(rows)]
        + [(e["step"], 1, i) for i, e in enumerate(evaluations)]
    )
    for _, kind, i in order:
        if kind == 0:
            sink.log_step(rows[i])
        else:
            sink.log_evaluation(evaluations[i])
    sink.flush()
    return {"steps": len(rows), "evaluations": len(evaluations)}


def _stored_log(recipe: dict[str, Any]) -> LogConfig:
    """The ``[log]`` section the run stored (defaults if it had none or it no longer
    validates: an export must not depend on the code that trained the run)."""
    try:
        return LogConfig.model_validate(recipe.get("log") or {})
    except ValueError:
        return LogConfig()


def export_run(
    ledger: Ledger, workspace: Workspace, run_ref: str, to: str, dest: str | None = None
) -> dict[str, Any]:
    """Replay run ``run_ref`` (an id, a unique part, or ``latest``) from the ledger into
    a new ``to`` sink: TensorBoard event files in ``dest``/<run id> (a folder is
    needed); an MLflow run at tracking URI ``dest`` (default: the recipe's
    ``log.mlflow_uri``, else ``MLFLOW_TRACKING_URI`` or MLflow's own); a W&B run whose
    files go under ``dest`` (default: the run's log folder in ``workspace``). The
    experiment, project and W&B mode are the run's stored ``[log]``.

    Returns the run id, the sink, where the copy went and the counts sent. Any fault of
    the sink is a one-line ``SinkError``."""
    if to not in KINDS:
        raise SinkError(f"unknown sink {to!r} (sinks: {', '.join(KINDS)})")
    run_id = ledger.resolve_run(run_ref)
    summary = ledger.run_summary(run_id)
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
        sink = opener(to, run_id, log, folder, live=False)()
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
        sink.close(status)
    except Exception as exc:
        raise SinkError(failure_line(to, exc)) from exc
    return {"run": run_id, "sink": to, "where": sink.where, "status": status, **counts}
