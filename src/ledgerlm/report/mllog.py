"""An MLPerf-style MLLOG file for one run, rebuilt from the ledger after the fact.

The lines are written with the ``mlperf_logging`` package's ``mllog`` module
(``pip install mlperf-logging``; imported only when an export is asked for), with every
timestamp taken from the ledger, never from the clock at export time:

- ``init_start`` at the run's creation (it exists in the ledger before any work), then
  the submission info and the hyperparameters of the stored recipe, then ``init_stop``
  when the last ``prep``/``tokenize`` phase ended; ``run_start`` at that same instant, so
  no second between them goes unaccounted;
- one block per evaluation interval: ``block_start`` when training resumed after the
  previous evaluation was recorded (the first train phase for the first block),
  ``block_stop`` when the evaluation phase began; ``eval_start``/``eval_stop`` are that
  phase's start and end and ``eval_accuracy`` (the target's metric: the validation
  loss, or a task's accuracy when the target is one, by the far end of its 95% interval
  under ``eval.confirm_by = "interval"``, as the ledger judges it) is the evaluation
  row's ``created_at``; the target's direction (``lower_is_better`` for a loss,
  ``higher_is_better`` for an accuracy) rides on ``eval_accuracy_target``. Evaluations
  written after the fact (``ledgerlm eval``) are no part of the run's timeline and are
  left out;
- ``run_stop`` with status ``success`` at the evaluation that confirmed the target
  (the same evaluation as ``time_to_target``; later evaluations, made when
  ``eval.stop_at_target = false``, lie outside the timed region and are left out), or
  ``aborted`` at the last instant the ledger knows of when the target was not reached.

Epochs are optimizer updates: a block covers updates ``first_epoch_num`` ..
``first_epoch_num + epoch_count - 1`` and its evaluation has ``epoch_num`` = the last
of them. Samples are sequences: ``samples_count`` = updates x ``global_batch_size``
(rows per update over all ranks); the tokens consumed ride along as ``tokens``.

MLPerf's score (``run_stop - run_start``) leaves init out and counts wall time,
restarts of a resumed run included; the ledger's time-to-target sums phase seconds
from the first one. ``run_stop`` carries the latter as ``ledger_time_to_target_s``,
its device time (wall x devices held, ``ledger.resources``) as
``ledger_device_seconds_to_target`` and the devices the run held last as
``ledger_devices`` (``None`` for a run recorded before resources were).

``mlperf_rules/ledgerlm.yaml`` holds the compliance rules for this benchmark;
``check_mllog`` runs the package's compliance checker with them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Literal

from ledgerlm.config import PackConfig, TrainConfig
from ledgerlm.extras import require
from ledgerlm.ledger.compare_tasks import after_the_fact
from ledgerlm.ledger.events import target_contract
from ledgerlm.ledger.target import higher_is_better

RULES = Path(__file__).with_name("mlperf_rules") / "ledgerlm.yaml"
INIT_KINDS = ("prep", "tokenize")
ORG = "ledgerlm"
DIVISION = "open"  # recipes are free to change any hyperparameter
STATUS = "research"
TARGET_KEY = "eval_accuracy_target"  # not an MLPerf constant: our target lives in the recipe
_SRC_ROOT = Path(__file__).parents[2]  # trimmed from the caller "file" in each line


def _mllog():
    return require("mlperf_logging.mllog", "the MLLOG export")


@dataclass(frozen=True)
class MLEvent:
    """One MLLOG line: ``kind`` is the ``MLLogger`` method (start, end or event)."""

    kind: Literal["start", "end", "event"]
    key: str
    time_ms: int
    value: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


def _ms(t: float) -> int:
    return round(t * 1000)


def _finite(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _phase_end(phase: Mapping[str, Any]) -> float:
    # An open phase (crash, kill) has no end; its start is the last instant known of it.
    if phase.get("ended_at") is not None:
        return float(phase["ended_at"])
    if phase.get("seconds") is not None:
        return float(phase["started_at"]) + float(phase["seconds"])
    return float(phase["started_at"])


def _train_value(recipe: Mapping[str, Any], key: str) -> Any:
    # A ledger written by older code may lack a newer key; the recipe default applies.
    train = recipe.get("train") or {}
    return train[key] if key in train else TrainConfig.model_fields[key].default


def _contract(summary: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return target_contract(summary) or {}
    except (TypeError, ValueError):
        return {}


def _hyperparameters(recipe: Mapping[str, Any], ranks: int, c: Any) -> dict[str, Any]:
    def t(key: str) -> Any:
        return _train_value(recipe, key)

    rows, accum = int(t("micro_batch_rows")), int(t("grad_accum"))
    lr = float(t("lr"))
    end_lr = lr if t("schedule") == "constant" else lr * float(t("min_lr_ratio"))
    out: dict[str, Any] = {
        c.GLOBAL_BATCH_SIZE: rows * accum * ranks,
        c.GRADIENT_ACCUMULATION_STEPS: accum,
        c.MICRO_BATCH_SIZE: rows,
        c.MAX_SEQUENCE_LENGTH: int(
            (recipe.get("pack") or {}).get("seq_len", PackConfig.model_fields["seq_len"].default)
        ),
        c.OPT_NAME: str(t("optimizer")),
        c.OPT_BASE_LR: lr,
        c.OPT_END_LR: end_lr,
    }
    if t("schedule_unit") == "tokens":
        out["opt_learning_rate_warmup_tokens"] = int(t("warmup_tokens"))
    else:
        out[c.OPT_LR_WARMUP_STEPS] = int(t("warmup_steps"))
    out[c.OPT_LR_DECAY_SCHEDULE] = f"{t('schedule')} with linear warmup"
    betas = t("betas")
    out |= {
        c.OPT_ADAMW_BETA_1: float(betas[0]),
        c.OPT_ADAMW_BETA_2: float(betas[1]),
        c.OPT_ADAMW_EPSILON: float(t("eps")),
        c.OPT_ADAMW_WEIGHT_DECAY: float(t("weight_decay")),
    }
    if t("optimizer") == "muon":
        out["opt_muon_learning_rate"] = float(t("muon_lr"))
    out |= {
        c.OPT_GRADIENT_CLIP_NORM: float(t("grad_clip")),
        c.MAX_STEPS: int(t("max_steps")),
        c.SEED: int(t("seed")),
    }
    return out


def mllog_events(summary: Mapping[str, Any]) -> list[MLEvent]:
    """The MLLOG lines of a run, in order, from ``Ledger.run_summary`` output alone.

    Times never decrease: an instant earlier than the line before it (clock steps
    between processes of a resumed run) is raised to that line's time.
    """
    c = _mllog().constants
    run = summary["run"]
    recipe = run.get("recipe") or {}
    metric, threshold = run["target_metric"], float(run["target_value"])
    verdict = summary["time_to_target"]
    contract = _contract(summary)
    ranks = int(contract.get("ranks") or 1)
    hparams = _hyperparameters(recipe, ranks, c)
    batch = hparams[c.GLOBAL_BATCH_SIZE]
    phases = list(summary.get("phases") or [])
    by_id = {p["id"]: p for p in phases}

    events: list[MLEvent] = []
    last = 0

    def emit(kind: Any, key: str, t: float, value: Any = None, **metadata: Any) -> None:
        nonlocal last
        last = max(last, _ms(t))
        events.append(MLEvent(kind, key, last, value, metadata))

    # init: the run's creation up to the end of data preparation and tokenization
    init_phases = [p for p in phases if p["kind"] in INIT_KINDS]
    starts = [float(p["started_at"]) for p in phases]
    created = run.get("created_at")
    init_start = float(created) if created is not None else min(starts, default=0.0)
    init_stop = max((_phase_end(p) for p in init_phases), default=init_start)
    emit("start", c.INIT_START, init_start)
    emit("event", c.SUBMISSION_BENCHMARK, init_start, f"ledgerlm_{run['name']}")
    emit("event", c.SUBMISSION_ORG, init_start, ORG)
    emit("event", c.SUBMISSION_DIVISION, init_start, DIVISION)
    emit("event", c.SUBMISSION_STATUS, init_start, STATUS)
    for key, value in hparams.items():
        emit("event", key, init_start, value)
    # The metric the ledger judges: a task metric by its interval's far end when asked.
    up = higher_is_better(metric)
    if contract.get("confirm_by") == "interval" and metric.startswith("task/"):
        metric = f"{metric}_low" if up else f"{metric}_high"
    unit = contract.get("unit", "nat/token")
    direction = "higher_is_better" if up else "lower_is_better"
    target_meta = {"metric": metric, "unit": unit, "direction": direction}
    for k in ("val_targets", "val_unigram_entropy"):
        if k in contract:
            target_meta[k] = _finite(contract[k])
    emit("event", TARGET_KEY, init_start, threshold, **target_meta)
    emit("end", c.INIT_STOP, init_stop)
    emit("start", c.RUN_START, init_stop, run_id=run["id"], ledger_status=run["status"])

    # the evaluations inside the timed region: all of them, or up to the confirming one
    later = after_the_fact(summary)
    evaluations = sorted(
        (e for e in summary.get("evaluations") or [] if e["id"] not in later),
        key=lambda e: e["step"],
    )
    omitted = 0
    if verdict["reached"]:
        confirming = verdict["evaluation"]["id"]
        cut = next(i for i, e in enumerate(evaluations) if e["id"] == confirming) + 1
        evaluations, omitted = evaluations[:cut], len(evaluations) - cut
    train_starts = [float(p["started_at"]) for p in phases if p["kind"] == "train"]
    block_start = max(min(train_starts, default=init_stop), init_stop)
    prev_step, confirmed_at = 0, init_stop
    for step, group in groupby(evaluations, key=lambda e: int(e["step"])):
        group = list(group)
        spans = []
        for e in group:
            phase = by_id.get(e.get("phase_id"))
            done = float(e["created_at"])
            span = (float(phase["started_at"]), _phase_end(phase)) if phase else (done, done)
            spans.append((*span, done))
        if step > prev_step:
            block = {
                c.FIRST_EPOCH_NUM: prev_step + 1,
                c.EPOCH_COUNT: step - prev_step,
                c.SAMPLES_COUNT: prev_step * batch,
            }
            emit("start", c.BLOCK_START, block_start, **block)
            emit("end", c.BLOCK_STOP, spans[0][0], **block)
            prev_step = step
        at = {c.EPOCH_NUM: step, c.SAMPLES_COUNT: step * batch}
        for e, (began, ended, done) in zip(group, spans, strict=True):
            metrics = {k: _finite(v) for k, v in (e.get("metrics") or {}).items()}
            emit("start", c.EVAL_START, began, **at)
            emit("end", c.EVAL_STOP, ended, **at)
            emit(
                "event",
                c.EVAL_ACCURACY,
                done,
                metrics.get(metric),
                **at,
                tokens=int(e["tokens"]),
                targets=int(e["targets"]),
                metric=metric,
                metrics=metrics,
                snapshot=e.get("snapshot"),
            )
            block_start = confirmed_at = done

    if verdict["reached"]:
        status, stop = c.SUCCESS, confirmed_at
    else:
        status = c.ABORTED
        known = [_phase_end(p) for p in phases] + starts
        known += [float(e["created_at"]) for e in summary.get("evaluations") or []]
        known += [float(e["created_at"]) for e in summary.get("events") or []]
        stop = max(known, default=last / 1000)
    emit(
        "end",
        c.RUN_STOP,
        stop,
        status=status,
        ledger_status=run["status"],
        ledger_time_to_target_s=verdict.get("seconds"),
        ledger_device_seconds_to_target=verdict.get("device_seconds"),
        ledger_devices=(summary.get("resources") or {}).get("devices"),
        evaluations_after_target=omitted,
    )
    return events


def export_mllog(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write the run's MLLOG lines to ``path`` (replaced atomically) and return it.

    A private ``MLLogger`` over its own ``logging.Logger`` with one file handler: the
    package's shared logger would also print to stdout and keep handlers between calls.
    """
    mllog = _mllog()
    events = mllog_events(summary)
    for e in events:  # mllog logs an error line instead of raising on what JSON can't hold
        json.dumps([e.value, e.metadata], allow_nan=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    logger = logging.Logger(f"ledgerlm.mllog.{summary['run']['id']}", logging.INFO)
    handler = logging.FileHandler(tmp, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    writer = mllog.mllog.MLLogger(logger=logger, root_dir=re.escape(str(_SRC_ROOT)))
    try:
        for e in events:
            log = getattr(writer, e.kind)
            log(e.key, e.value, metadata=e.metadata or None, time_ms=e.time_ms)
        handler.close()
        os.replace(tmp, path)
    except BaseException:
        handler.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_mllog(path: str | Path, rules: str | Path = RULES, *, werror: bool = True) -> list[str]:
    """Run ``mlperf_logging``'s compliance checker on ``path``; its failures (empty: pass).

    ``werror`` makes a repeated EXACTLY_ONE key with equal values a failure, as
    ``--werror`` does on the checker's command line.
    """
    mlp_compliance = require("mlperf_logging.compliance_checker.mlp_compliance", "the MLLOG check")
    mlp_parser = require("mlperf_logging.compliance_checker.mlp_parser", "the MLLOG check")
    ruleset = mlp_compliance.get_parser().get_default("ruleset")  # only picks the parser
    checker = mlp_compliance.make_checker("training", ruleset, False, werror)
    lines, errors = mlp_parser.parse_file(str(path), ruleset=ruleset)
    failures = [f"line does not parse ({why}): {line}" for line, why in errors]
    checker.check_loglines(lines, str(Path(rules).resolve()))
    failures += [*checker.overwritable.values(), *checker.not_overwritable]
    return failures
