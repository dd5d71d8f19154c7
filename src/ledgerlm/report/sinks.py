"""Copies of a run's series for the dashboards people already use: TensorBoard, MLflow
and Weights & Biases.

The ledger stays the record; a sink gets what the ledger already holds. While a run
trains, ``lab.recorder.LedgerRecorder`` hands each per-update row to its ``SinkSet``
right after writing it to the ledger, and each evaluation right after recording it;
``lab.sinks.replay_to_sinks`` replays a finished run the same way. So a dashboard never shows
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
- each downstream task's keys as the ledger names them: ``task/<name>/<metric>`` with
  its ``_stderr`` and its 95% interval ``_low`` and ``_high`` (a dashboard draws the
  interval from those two series; the ledger holds no other form of it), and
  ``task/<name>/items``. A task name is a recipe name (letters, digits, ``-``, ``_``,
  ``.``), which TensorBoard and MLflow take as it is; W&B sorts and filters only names
  whose parts between slashes are letters, digits and ``_`` (not first a digit), so
  there every other character becomes ``_`` (``wandb_key``): ``code-next-line`` is
  ``task/code_next_line/acc`` in W&B;
- the recipe's settings in effect as parameters: dotted keys (``train.lr``) for MLflow
  and in a TensorBoard text panel, the nested tree as W&B's config;
- when the run ends, its bill (``final_scalars``): ``ledger/wall_seconds`` and
  ``ledger/device_seconds`` (wall x devices held) of every phase and, when the target
  was confirmed, ``ledger/time_to_target_s`` and ``ledger/device_seconds_to_target``; at
  the run's last step in TensorBoard and MLflow, in W&B's run summary.

Every point carries the wall time the ledger holds for it: an update's end (its row's
``at``), an evaluation's ``created_at`` when replayed; a replayed MLflow run starts and
ends when the ledger run did. So an export looks like the live copy, not like the
minute it was made.

Each library is imported when its sink is opened, so none is needed to train;
``check_sink`` refuses a sink whose library is missing, naming the extra, before anything
is written (a run checks its recipe's sinks with it, ``ledger export`` its ``--to``).
``SinkSet`` keeps training independent of the sinks: a sink that raises is reported once
and dropped for the rest of the run.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from ledgerlm.config import LogConfig
from ledgerlm.extras import available, missing_message
from ledgerlm.ledger.compare import flatten
from ledgerlm.ledger.steps import throughput

# the sinks a recipe may name; each is also the module its library installs and the extra
KINDS: tuple[str, ...] = get_args(get_args(LogConfig.model_fields["sinks"].annotation)[0])
MESSAGE_CHARS = 1000  # a failure's message is kept to one line of at most this


class SinkError(ValueError):
    """A sink that cannot be opened or written; the message is one line naming it.

    A ``ValueError`` so that the command line reports it as one line, like a bad input."""


def check_sink(kind: str, field: str = "log.sinks") -> None:
    """Refuse the ``kind`` sink before anything is written: an unknown name, or a library
    that is not installed, is a one-line ``SinkError`` that starts with ``field`` (where
    the name was given) and names the extra that installs it. Cheap: nothing is imported."""
    if kind not in KINDS:
        raise SinkError(f"{field}: unknown sink {kind!r} (sinks: {', '.join(KINDS)})")
    if not available(kind):
        raise SinkError(f"{field}: {missing_message(kind, kind)}")


class Sink(Protocol):
    """What the ledger's series are copied to. ``where`` says where they go, for people;
    ``view`` is a command line that shows the copy, when there is one."""

    name: str
    where: str
    view: str | None

    def log_params(self, params: dict[str, Any]) -> None:
        """The resolved recipe as the ledger stores it (``Recipe.to_dict``), less the
        settings nothing reads (``config.settings_in_effect``)."""

    def log_step(self, row: dict[str, Any]) -> None:
        """One per-update row as the ledger holds it (``Ledger.steps``), stamped with its
        ``at`` (epoch seconds; now when None)."""

    def log_evaluation(self, record: dict[str, Any]) -> None:
        """One evaluation: ``step`` and ``metrics`` (and ``created_at`` when replayed)."""

    def log_summary(self, values: dict[str, float], step: int, at: float | None) -> None:
        """The run's final figures (``final_scalars``) at its last ``step``."""

    def flush(self) -> None:
        """Send what is buffered."""

    def close(self, status: str = "reached", ended_at: float | None = None) -> None:
        """End the copy; ``status`` is the run's status in the ledger, ``ended_at`` when
        the run ended (epoch seconds; now when None)."""


def failure_line(name: str, exc: BaseException) -> str:
    """``<sink>: <error type>: <message>`` on one line, at most ``MESSAGE_CHARS`` long."""
    text = " ".join(str(exc).split()) or "(no message)"
    line = f"{name}: {type(exc).__name__}: {text}"
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


def missing(kind: str, exc: ImportError) -> SinkError:
    """A library found by ``check_sink`` that still cannot be imported."""
    return SinkError(f"{missing_message(kind, f'the {kind} sink')} ({' '.join(str(exc).split())})")


def _ms(at: float | None) -> int:
    """Epoch seconds (now when None) as MLflow's epoch milliseconds."""
    return round(1000 * (time.time() if at is None else at))


def flat_params(tree: dict[str, Any]) -> dict[str, str]:
    """``{"train": {"lr": 0.003}}`` as ``{"train.lr": "0.003"}``: strings as they are,
    anything else (numbers, lists, null) as JSON."""
    return {
        name: value if isinstance(value, str) else json.dumps(value, default=str)
        for name, value in flatten(tree).items()
    }


def step_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The scalars of one per-update row."""
    out = {
        "train/loss": float(row["loss"]),
        "train/grad_norm": float(row["grad_norm"]),
        "train/lr": float(row["lr"]),
    }
    if (rate := throughput(row)) is not None:
        out["train/tokens_per_s"] = rate
    return out


def _scalar_name(key: str) -> str:
    if key.startswith("task/"):
        return key
    return f"{'val_domain' if '/' in key else 'val'}/{key}"


def evaluation_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one evaluation: ``val/<metric>`` for an overall metric,
    ``val_domain/<metric>/<domain>`` for a per-domain one (``<metric>/<domain>``), a task's
    keys (``task/<name>/...``) as they are."""
    return {_scalar_name(k): float(v) for k, v in record["metrics"].items() if v is not None}


_WANDB_OFF = re.compile(r"[^A-Za-z0-9_]")


def wandb_key(name: str) -> str:
    """``name`` as W&B sorts and filters it: each part between slashes of letters,
    digits and ``_`` only, never first a digit (``task/code-next-line/acc`` is
    ``task/code_next_line/acc``)."""
    parts = [_WANDB_OFF.sub("_", part) for part in name.split("/")]
    return "/".join(f"_{p}" if p[:1].isdigit() else p for p in parts)


def final_scalars(summary: dict[str, Any]) -> tuple[dict[str, float], int]:
    """A run's bill for its sinks' summary: wall and device seconds of all its phases and,
    when the target was confirmed, of its time-to-target; with the run's last step."""
    ttt = summary["time_to_target"]
    reached = bool(ttt.get("reached"))
    values = {
        "ledger/wall_seconds": summary.get("total_seconds"),
        "ledger/device_seconds": summary.get("device_seconds"),
        "ledger/time_to_target_s": ttt.get("seconds") if reached else None,
        "ledger/device_seconds_to_target": ttt.get("device_seconds") if reached else None,
    }
    steps = [int(e["step"]) for e in summary.get("evaluations") or []]
    step = max([*steps, int((summary.get("steps_recorded") or {}).get("updates") or 0)])
    return {k: float(v) for k, v in values.items() if v is not None}, step


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
        self.view = f"tensorboard --logdir {shlex.quote(self.where)}"
        self._writer = SummaryWriter(log_dir=str(logdir))

    def log_params(self, params: dict[str, Any]) -> None:
        lines = [f"    {k} = {v}" for k, v in sorted(flat_params(params).items())]
        self._writer.add_text("recipe", "\n".join(lines), global_step=0)

    def log_step(self, row: dict[str, Any]) -> None:
        at = row.get("at")
        for tag, value in step_scalars(row).items():
            self._writer.add_scalar(tag, value, global_step=int(row["step"]), walltime=at)

    def log_evaluation(self, record: dict[str, Any]) -> None:
        at = record.get("created_at")
        for tag, value in evaluation_scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=int(record["step"]), walltime=at)

    def log_summary(self, values: dict[str, float], step: int, at: float | None) -> None:
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step, walltime=at)

    def flush(self) -> None:
        self._writer.flush()

    def close(self, status: str = "reached", ended_at: float | None = None) -> None:
        self._writer.close()


# -- MLflow -------------------------------------------------------------------------------

RUN_TAG = "ledgerlm.run_id"
SOURCE_TAG = "ledgerlm.source"  # "training" (the live copy) or "export"
STATUS_TAG = "ledgerlm.status"


class MLflowSink:
    """An MLflow run named by the ledger run's id in ``experiment``, through an explicit
    ``MlflowClient(uri)`` (``None``: ``MLFLOW_TRACKING_URI`` or MLflow's default).

    One MLflow run per ledger run and ``source``: the live copy (``"training"``) and the
    replay (``"export"``), found again by their tags. A resumed run's live copy
    continues the run its first process made; a second export of a run updates the
    first export's run and sends only the points it lacks (each point is known by its
    step and time, which a replay takes from the ledger), so exporting twice leaves one
    run holding each point once. A new run starts at ``started_at`` (epoch seconds; now
    when None). Metrics are buffered and sent in batches at each ``flush``.
    """

    name = "mlflow"
    view = None
    BATCH = 1000  # metrics per request (MLflow's limit)
    PARAMS = 100  # params per request (MLflow's limit)

    def __init__(
        self,
        run_id: str,
        *,
        uri: str | None = None,
        experiment: str = "ledgerlm",
        source: Literal["training", "export"] = "training",
        started_at: float | None = None,
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
        earlier = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{RUN_TAG}` = '{run_id}' and tags.`{SOURCE_TAG}` = '{source}'",
            max_results=1,
        )
        # (step, ms) of each metric's points already in the run: None for a new run
        self._sent: dict[str, set[tuple[int, int]]] | None = None
        if earlier:
            self.mlflow_run_id = earlier[0].info.run_id
            client.update_run(self.mlflow_run_id, status="RUNNING")
            self._sent = {}
        else:
            run = client.create_run(
                experiment_id,
                start_time=None if started_at is None else _ms(started_at),
                run_name=run_id,
                tags={RUN_TAG: run_id, SOURCE_TAG: source},
            )
            self.mlflow_run_id = run.info.run_id
        self.where = f"{client.tracking_uri} (experiment {experiment}, run {self.mlflow_run_id})"
        self._pending: list[Any] = []

    def _add(self, scalars: dict[str, float], step: int, at: float | None) -> None:
        ms = _ms(at)
        self._pending.extend(self._metric(k, v, ms, step) for k, v in scalars.items())

    def _new(self, metric: Any) -> bool:
        """Whether the run lacks this point (always, for a run this sink created)."""
        if self._sent is None:
            return True
        if metric.key not in self._sent:
            history = self.client.get_metric_history(self.mlflow_run_id, metric.key)
            self._sent[metric.key] = {(m.step, m.timestamp) for m in history}
        point = (metric.step, metric.timestamp)
        if point in self._sent[metric.key]:
            return False
        self._sent[metric.key].add(point)
        return True

    def log_params(self, params: dict[str, Any]) -> None:
        pairs = [self._param(k, v) for k, v in flat_params(params).items()]
        for chunk in _chunks(pairs, self.PARAMS):
            self.client.log_batch(self.mlflow_run_id, params=chunk)

    def log_step(self, row: dict[str, Any]) -> None:
        self._add(step_scalars(row), int(row["step"]), row.get("at"))

    def log_evaluation(self, record: dict[str, Any]) -> None:
        self._add(evaluation_scalars(record), int(record["step"]), record.get("created_at"))

    def log_summary(self, values: dict[str, float], step: int, at: float | None) -> None:
        self._add(values, step, at)

    def flush(self) -> None:
        pending, self._pending = [m for m in self._pending if self._new(m)], []
        for chunk in _chunks(pending, self.BATCH):
            self.client.log_batch(self.mlflow_run_id, metrics=chunk)

    def close(self, status: str = "reached", ended_at: float | None = None) -> None:
        self.flush()
        self.client.set_tag(self.mlflow_run_id, STATUS_TAG, status)
        ended = {"failed": "FAILED", "running": "KILLED"}.get(status, "FINISHED")
        self.client.set_terminated(self.mlflow_run_id, ended, end_time=_ms(ended_at))


# -- Weights & Biases ---------------------------------------------------------------------


def wandb_id(run_id: str, source: str = "training") -> str:
    """The W&B run id of a ledger run's copy: the live copy's is the run id, an export's
    ``<run id>-export``; fixed, so a resume or a second export updates the same W&B run."""
    return run_id if source == "training" else f"{run_id}-export"


class WandbSink:
    """A W&B run in ``project`` named by the ledger run's id, its files under ``folder``.

    The optimizer step is logged as the metric ``step`` and every ``train/*``, ``val/*``,
    ``val_domain/*`` and ``task/*`` series (named by ``wandb_key``) is plotted against it
    (``define_metric``), rather than passed as ``run.log(..., step=)``: W&B drops a
    point whose step is below one already logged, and an asynchronous evaluation is
    recorded after later updates were. Each row keeps
    the ledger's time as its ``_timestamp``. The W&B run's id is ``wandb_id`` with
    ``resume="allow"``: a resumed run continues its live copy and a second export its
    first export (offline, each process still writes its own folder, of that same run
    id, for ``wandb sync``). Console capture is off: the terminal stays the lab's.
    """

    name = "wandb"

    def __init__(
        self,
        run_id: str,
        *,
        project: str = "ledgerlm",
        folder: Path,
        mode: str | None = None,
        source: Literal["training", "export"] = "training",
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
            id=wandb_id(run_id, source),
            resume="allow",
            reinit="create_new",  # never the caller's own run, never finishing it
            settings=wandb.Settings(console="off"),
        )
        self.run.define_metric("step")
        for series in ("train/*", "val/*", "val_domain/*", "task/*"):
            self.run.define_metric(series, step_metric="step")
        self.where = str(
            Path(self.run.dir).parent
        )  # <folder>/wandb/<offline-run or run>-<time>-<id>
        self.view = f"wandb sync {shlex.quote(self.where)}" if self.run.offline else self.run.url

    def _log(self, step: int, scalars: dict[str, float], at: float | None) -> None:
        stamp = {} if at is None else {"_timestamp": float(at)}
        self.run.log({"step": step, **stamp, **{wandb_key(k): v for k, v in scalars.items()}})

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_step(self, row: dict[str, Any]) -> None:
        self._log(int(row["step"]), step_scalars(row), row.get("at"))

    def log_evaluation(self, record: dict[str, Any]) -> None:
        self._log(int(record["step"]), evaluation_scalars(record), record.get("created_at"))

    def log_summary(self, values: dict[str, float], step: int, at: float | None) -> None:
        self.run.summary.update(values)

    def flush(self) -> None:
        pass  # run.log hands each row to W&B's own process at once

    def close(self, status: str = "reached", ended_at: float | None = None) -> None:
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

    def close(self, status: str, final: tuple[dict[str, float], int] | None = None) -> None:
        """Close every sink (each closed once, even if another fails), after sending it
        the run's ``final`` figures (``final_scalars``) when given; none is left."""
        if final is not None:
            values, step = final
            self._each(lambda s: s.log_summary(values, step, None))
        self._each(lambda s: s.close(status))
        self.sinks = []
