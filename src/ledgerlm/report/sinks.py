"""Copies of a run's series for the dashboards people already use: TensorBoard, MLflow
and Weights & Biases.

The ledger stays the record; a sink gets what the ledger already holds. While a run
trains, ``lab.recorder.LedgerRecorder`` hands each per-update row to its ``SinkSet``
right after writing it to the ledger, and each evaluation right after recording it;
``lab.sinks.export_run`` replays a finished run the same way. So a dashboard never shows
a point the ledger lacks.

Names are the same in every sink, with the optimizer step as x:

- ``train/loss``, ``train/grad_norm``, ``train/lr`` and ``train/tokens_per_s`` (the
  update's tokens over its seconds) for each update;
- ``val/<metric>`` for each overall metric of an evaluation (``val/loss``, ``val/bpb``,
  ``val/nats_per_char``) and ``val_domain/<metric>/<domain>`` for each per-domain one
  (the ledger's ``loss/<domain>``, ``bpb/<domain>``): not ``val/loss/<domain>``, since
  MLflow's file store keeps a metric as a file named by its path, so ``val/loss`` could
  not also be a folder. A metric that failed to compute (null in the ledger) is left
  out;
- the recipe's settings in effect as parameters: dotted keys (``train.lr``) for MLflow
  and in a TensorBoard text panel, the nested tree as W&B's config.

Each library is imported when its sink is opened, so none is needed to train; a missing
one names the extra that installs it. ``SinkSet`` keeps training independent of the
sinks: a sink that raises is reported once and dropped for the rest of the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

EXTRAS = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny", "wandb": "wandb"}
MESSAGE_CHARS = 1000  # a failure's message is kept to one line of at most this


class SinkError(ValueError):
    """A sink that cannot be opened or written; the message is one line naming it.

    A ``ValueError`` so that the command line reports it as one line, like a bad input."""


class Sink(Protocol):
    """What the ledger's series are copied to. ``where`` says where they go, for people."""

    name: str
    where: str

    def log_params(self, params: dict[str, Any]) -> None:
        """The resolved recipe as the ledger stores it (``Recipe.to_dict``), less the
        settings nothing reads (``config.settings_in_effect``)."""

    def log_step(self, row: dict[str, Any]) -> None:
        """One per-update row as the ledger holds it (``Ledger.steps``)."""

    def log_evaluation(self, record: dict[str, Any]) -> None:
        """One evaluation: ``step`` and ``metrics`` (and ``created_at`` when replayed)."""

    def flush(self) -> None:
        """Send what is buffered."""

    def close(self, status: str = "reached") -> None:
        """End the copy; ``status`` is the run's status in the ledger."""


def failure_line(name: str, exc: BaseException) -> str:
    """``<sink>: <error type>: <message>`` on one line, at most ``MESSAGE_CHARS`` long."""
    text = " ".join(str(exc).split()) or "(no message)"
    line = f"{name}: {type(exc).__name__}: {text}"
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def missing(kind: str, exc: ImportError) -> SinkError:
    return SinkError(
        f"the {kind} sink needs {EXTRAS[kind]} ({' '.join(str(exc).split())}): "
        f"pip install 'ledgerlm[{kind}]'"
    )


def flat_params(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"train": {"lr": 0.003}}`` as ``{"train.lr": "0.003"}``: strings as they are,
    anything else (numbers, lists, null) as JSON."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


def step_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The scalars of one per-update row."""
    out = {
        "train/loss": float(row["loss"]),
        "train/grad_norm": float(row["grad_norm"]),
        "train/lr": float(row["lr"]),
    }
    if row.get("seconds"):
        out["train/tokens_per_s"] = float(row["tokens"]) / float(row["seconds"])
    return out


def evaluation_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one evaluation: ``val/<metric>`` for an overall metric,
    ``val_domain/<metric>/<domain>`` for a per-domain one (``<metric>/<domain>``)."""
    return {
        f"{'val_domain' if '/' in k else 'val'}/{k}": float(v)
        for k, v in record["metrics"].items()
        if v is not None
    }


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


# -- TensorBoard --------------------------------------------------------------------------


class TensorBoardSink:
    """Event files in ``logdir`` (``torch.utils.tensorboard``, which needs tensorboard);
    the recipe is a text panel named ``recipe``."""

    name = "tensorboard"

    def __init__(self, logdir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise missing("tensorboard", exc) from None
        self.where = str(logdir)
        self._writer = SummaryWriter(log_dir=str(logdir))

    def log_params(self, params: dict[str, Any]) -> None:
        lines = [f"    {k} = {v}" for k, v in sorted(flat_params(params).items())]
        self._writer.add_text("recipe", "\n".join(lines), global_step=0)

    def log_step(self, row: dict[str, Any]) -> None:
        for tag, value in step_scalars(row).items():
            self._writer.add_scalar(tag, value, global_step=int(row["step"]))

    def log_evaluation(self, record: dict[str, Any]) -> None:
        at = record.get("created_at")
        for tag, value in evaluation_scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=int(record["step"]), walltime=at)

    def flush(self) -> None:
        self._writer.flush()

    def close(self, status: str = "reached") -> None:
        self._writer.close()


# -- MLflow -------------------------------------------------------------------------------

RUN_TAG = "ledgerlm.run_id"
SOURCE_TAG = "ledgerlm.source"  # "training" (the live copy) or "export"
STATUS_TAG = "ledgerlm.status"


class MLflowSink:
    """An MLflow run named by the ledger run's id in ``experiment``, through an explicit
    ``MlflowClient(uri)`` (``None``: ``MLFLOW_TRACKING_URI`` or MLflow's default).

    With ``resume``, the live copy of a run that is resumed continues the MLflow run its
    first process made (found by its tags); an export always makes a new one. Metrics are
    buffered and sent in batches at each ``flush``.
    """

    name = "mlflow"
    BATCH = 1000  # metrics per request (MLflow's limit)
    PARAMS = 100  # params per request (MLflow's limit)

    def __init__(
        self,
        run_id: str,
        *,
        uri: str | None = None,
        experiment: str = "ledgerlm",
        resume: bool = True,
    ) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise missing("mlflow", exc) from None
        self._metric, self._param = Metric, Param
        self.client = client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        source = "training" if resume else "export"
        earlier = []
        if resume:
            earlier = client.search_runs(
                [experiment_id],
                filter_string=(
                    f"tags.`{RUN_TAG}` = '{run_id}' and tags.`{SOURCE_TAG}` = '{source}'"
                ),
                max_results=1,
            )
        if earlier:
            self.mlflow_run_id = earlier[0].info.run_id
            client.update_run(self.mlflow_run_id, status="RUNNING")
        else:
            run = client.create_run(
                experiment_id, run_name=run_id, tags={RUN_TAG: run_id, SOURCE_TAG: source}
            )
            self.mlflow_run_id = run.info.run_id
        self.where = f"{client.tracking_uri} (experiment {experiment}, run {self.mlflow_run_id})"
        self._pending: list[Any] = []

    def _add(self, scalars: dict[str, float], step: int, at: float | None = None) -> None:
        ms = int(1000 * (time.time() if at is None else at))
        self._pending.extend(self._metric(k, v, ms, step) for k, v in scalars.items())

    def log_params(self, params: dict[str, Any]) -> None:
        pairs = [self._param(k, v) for k, v in flat_params(params).items()]
        for chunk in _chunks(pairs, self.PARAMS):
            self.client.log_batch(self.mlflow_run_id, params=chunk)

    def log_step(self, row: dict[str, Any]) -> None:
        self._add(step_scalars(row), int(row["step"]))

    def log_evaluation(self, record: dict[str, Any]) -> None:
        self._add(evaluation_scalars(record), int(record["step"]), record.get("created_at"))

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for chunk in _chunks(pending, self.BATCH):
            self.client.log_batch(self.mlflow_run_id, metrics=chunk)

    def close(self, status: str = "reached") -> None:
        self.flush()
        self.client.set_tag(self.mlflow_run_id, STATUS_TAG, status)
        ended = {"failed": "FAILED", "running": "KILLED"}.get(status, "FINISHED")
        self.client.set_terminated(self.mlflow_run_id, ended)


# -- Weights & Biases ---------------------------------------------------------------------


class WandbSink:
    """A W&B run in ``project`` named by the ledger run's id, its files under ``folder``.

    The optimizer step is logged as the metric ``step`` and every ``train/*``, ``val/*``
    and ``val_domain/*`` series is plotted against it (``define_metric``), rather than passed as
    ``run.log(..., step=)``: W&B drops a point whose step is below one already logged,
    and an asynchronous evaluation is recorded after later updates were. With ``resume``
    the W&B run's id is the ledger run's, so a resumed run continues it; an export gets
    a new one. Console capture is off: the terminal stays the lab's.
    """

    name = "wandb"

    def __init__(
        self,
        run_id: str,
        *,
        project: str = "ledgerlm",
        folder: Path,
        mode: str | None = None,
        resume: bool = True,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise missing("wandb", exc) from None
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            dir=str(folder),
            mode=mode,
            name=run_id,
            id=run_id if resume else None,
            resume="allow" if resume else None,
            reinit="create_new",  # never the caller's own run, never finishing it
            settings=wandb.Settings(console="off"),
        )
        self.run.define_metric("step")
        for series in ("train/*", "val/*", "val_domain/*"):
            self.run.define_metric(series, step_metric="step")
        self.where = str(
            Path(self.run.dir).parent
        )  # <folder>/wandb/<offline-run or run>-<time>-<id>

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_step(self, row: dict[str, Any]) -> None:
        self.run.log({"step": int(row["step"]), **step_scalars(row)})

    def log_evaluation(self, record: dict[str, Any]) -> None:
        self.run.log({"step": int(record["step"]), **evaluation_scalars(record)})

    def flush(self) -> None:
        pass  # run.log hands each row to W&B's own process at once

    def close(self, status: str = "reached") -> None:
        self.run.summary["ledger_status"] = status
        self.run.finish(exit_code=1 if status == "failed" else 0)


# -- fan-out ------------------------------------------------------------------------------


class SinkSet:
    """The sinks of one run, called together; training never waits on a broken one.

    Any ``Exception`` a sink raises, opening it included, goes to ``on_failure(name,
    exc)`` (the lab writes it to the ledger) and the sink is dropped for the rest of the
    run; the others carry on. ``seconds`` keeps what each sink cost, so the time spent
    copying is known too.
    """

    def __init__(
        self,
        sinks: Iterable[Sink] = (),
        on_failure: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self.on_failure = on_failure
        self.seconds: dict[str, float] = {s.name: 0.0 for s in self.sinks}

    def __len__(self) -> int:
        return len(self.sinks)

    def _failed(self, name: str, exc: Exception) -> None:
        if self.on_failure is not None:
            self.on_failure(name, exc)

    def open(self, name: str, opener: Callable[[], Sink]) -> Sink | None:
        """Open a sink with ``opener``; on failure report it and keep nothing."""
        began = time.perf_counter()
        try:
            sink = opener()
        except Exception as exc:
            self._failed(name, exc)
            return None
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began
        self.sinks.append(sink)
        return sink

    def _each(self, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            began = time.perf_counter()
            try:
                call(sink)
            except Exception as exc:
                self.sinks.remove(sink)
                self._failed(sink.name, exc)
            finally:
                spent = time.perf_counter() - began
                self.seconds[sink.name] = self.seconds.get(sink.name, 0.0) + spent

    def log_params(self, params: dict[str, Any]) -> None:
        self._each(lambda s: s.log_params(params))

    def log_steps(self, rows: list[dict[str, Any]]) -> None:
        """Rows just written to the ledger, then a flush."""

        def send(sink: Sink) -> None:
            for row in rows:
                sink.log_step(row)
            sink.flush()

        self._each(send)

    def log_evaluation(self, record: dict[str, Any]) -> None:
        """An evaluation just recorded in the ledger, then a flush."""

        def send(sink: Sink) -> None:
            sink.log_evaluation(record)
            sink.flush()

        self._each(send)

    def close(self, status: str) -> None:
        """Close every sink (each closed once, even if another fails); none is left."""
        self._each(lambda s: s.close(status))
        self.sinks = []
