"""lm-evaluation-harness on ledgerlm's own items: the other scorer ``ledgerlm eval
--harness`` runs, offline, on a run's snapshot exported as a Hugging Face folder.

The harness scores exactly the items ledgerlm scores: each task's items (``TaskSet``,
after its limit, few-shot examples already in each context, as ``tasks.items`` draws
them per item) are written as a JSONL file, and a task YAML names it as a local
``json`` dataset with no few-shot examples of the harness's own (its sampler would draw
others). The record fields are read as fields (``doc_to_text: context``), not through
Jinja, so no template trims a context's whitespace; the continuation is the harness's
``target_delimiter`` (the task's ``delimiter``) and the choice or the answer, as in
``tasks.items``:

- ``choice``: ``multiple_choice`` (``acc``, ``acc_norm``);
- ``exact``: ``generate_until`` with the task's stop strings, ``max_gen_toks`` and
  greedy decoding, ``exact_match`` ignoring whitespace at either end (stripped);
- ``bpb``: ``loglikelihood`` of the continuation (which the harness takes whole, adding
  no delimiter); its bits per byte come from the item's log-likelihood and the bytes of
  its continuation as scored (``tasks.encoding``).

Only the YAML files written here are tasks: ``TaskManager(include_path=...,
include_defaults=False)`` skips the harness's scan of its built-in tasks. The harness
runs in a child process (``python -c`` calling ``child``) with ``HF_HUB_OFFLINE``,
``HF_DATASETS_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` set and its caches inside the work
folder, so nothing is downloaded or written elsewhere (the libraries read those
settings when first imported, which a child guarantees), and its own output (progress
bars, warnings) goes to a log file there. The model is the ``hf`` one on the CPU, in
float32, with BOS added (every training document starts with it), its context the
run's ``seq_len``. The child prints one marked JSON line per scored task (for
progress) and writes every item's record (``log_samples``) to a file the parent reads
back.

Each task's item scores become ``tasks.score.TaskResult``: the same per-item lists and
the same metric keys (``tasks.stats``) as scoring in process, so the two can be
compared item by item.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tasks import stats
from ledgerlm.tasks.encoding import split_pair
from ledgerlm.tasks.items import TaskSet
from ledgerlm.tasks.score import TaskResult

PREFIX = "ledgerlm-"  # a harness task's name: the prefix and the ledgerlm task's name
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
LOG = "harness.log"
SAMPLES = "samples.json"
SPEC = "spec.json"
DONE = "ledgerlm-harness-done "  # starts the child's line for a task scored
# whitespace at either end of a generation and of its answer is ignored (stripped)
STRIP = ["^\\s+", "\\s+$"]


class HarnessError(ValueError):
    """lm-evaluation-harness failed; the message is one line, with the last line of its
    log (a traceback's last line: the error)."""


def harness_name(task: TaskSet) -> str:
    return PREFIX + task.name


def records(task: TaskSet) -> list[dict[str, Any]]:
    """The harness's documents: one per scored item, its prompt as ledgerlm built it."""
    if task.kind == "choice":
        return [
            {"context": it.context, "choices": list(it.choices), "gold": it.gold}
            for it in task.items
        ]
    if task.kind == "exact":
        return [{"context": it.context, "answer": it.answer} for it in task.items]
    # the harness adds no delimiter to a loglikelihood request's target: it is given whole
    return [{"context": it.context, "continuation": it.continuations[0]} for it in task.items]


def task_config(task: TaskSet, data_file: Path, cache: Path) -> dict[str, Any]:
    """The harness task (its YAML) scoring ``data_file``, the items of ``task``."""
    cfg = task.cfg
    config: dict[str, Any] = {
        "task": harness_name(task),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}, "cache_dir": str(cache)},
        "test_split": "test",
        "num_fewshot": 0,
        "doc_to_text": "context",
        "target_delimiter": cfg.delimiter,
        "fewshot_delimiter": cfg.fewshot_delimiter,
    }
    if task.kind == "choice":
        metrics = [
            {"metric": m, "aggregation": "mean", "higher_is_better": True} for m in cfg.metrics
        ]
        return {
            **config,
            "output_type": "multiple_choice",
            "doc_to_choice": "choices",
            "doc_to_target": "gold",
            "metric_list": metrics,
        }
    if task.kind == "exact":
        return {
            **config,
            "output_type": "generate_until",
            "doc_to_target": "answer",
            "generation_kwargs": {
                "until": list(cfg.stop),
                "max_gen_toks": cfg.max_new_tokens,
                "do_sample": False,
                "temperature": 0.0,
            },
            "metric_list": [
                {
                    "metric": "exact_match",
                    "aggregation": "mean",
                    "higher_is_better": True,
                    "regexes_to_ignore": STRIP,
                }
            ],
        }
    return {
        **config,
        "output_type": "loglikelihood",
        "doc_to_target": "continuation",
        "metric_list": [
            {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False}
        ],
    }


def write_tasks(tasks: Sequence[TaskSet], work: Path) -> Path:
    """Each task's items (JSONL) and YAML under ``work``; returns the YAML folder. A YAML
    file is written as JSON, which YAML reads as it is (no quoting rules to get wrong)."""
    folder, data, cache = work / "tasks", work / "data", work / "cache"
    for path in (folder, data, cache):
        path.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        items = data / f"{task.name}.jsonl"
        with items.open("w", encoding="utf-8") as f:
            for record in records(task):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        config = task_config(task, items, cache)
        text = json.dumps(config, ensure_ascii=False, indent=2)
        (folder / f"{task.name}.yaml").write_text(text + "\n", encoding="utf-8")
    return folder


def offline_env(work: Path) -> dict[str, str]:
    """The child's environment: offline, its caches in ``work``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({k: "1" for k in OFFLINE})
    env.update(
        HF_HOME=str(work / "hf-home"),
        HF_DATASETS_CACHE=str(work / "cache"),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_harness(
    model_dir: Path,
    tasks: Sequence[TaskSet],
    work: Path,
    *,
    seq_len: int,
    rows: int = 16,
    progress: Progress | None = None,
) -> list[TaskResult]:
    """Score ``tasks`` with lm-evaluation-harness on the HF folder ``model_dir``, every
    file of it in ``work`` (module doc); one ``TaskResult`` per task, in order."""
    progress = progress or NullProgress()
    work = Path(work).resolve()
    spec = {
        "model_dir": str(model_dir),
        "include_path": str(write_tasks(tasks, work)),
        "tasks": [harness_name(t) for t in tasks],
        "max_length": int(seq_len),
        "batch_size": int(rows),
        "out": str(work / SAMPLES),
    }
    (work / SPEC).write_text(json.dumps(spec), encoding="utf-8")
    code = "import sys; from ledgerlm.lab.harness import child; child(sys.argv[1])"
    seconds: dict[str, float] = {}
    with (
        (work / LOG).open("w", encoding="utf-8") as log,
        progress.task("lm-evaluation-harness", total=len(tasks)) as bar,
    ):
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(work / SPEC)],
            cwd=work,
            env=offline_env(work),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        try:
            for line in proc.stdout or ():
                if not line.startswith(DONE):  # the harness's own printing: into the log
                    log.write(line)
                    continue
                done = json.loads(line.removeprefix(DONE))
                seconds[done["task"]] = float(done["seconds"])
                bar.advance(1, info=done["task"].removeprefix(PREFIX))
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if rc != 0 or not (work / SAMPLES).is_file():
        raise HarnessError(f"lm-evaluation-harness failed (exit {rc}): {_last_words(work / LOG)}")
    samples = json.loads((work / SAMPLES).read_text(encoding="utf-8"))
    return [parse_samples(t, samples[harness_name(t)], seconds[harness_name(t)]) for t in tasks]


def _last_words(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    said = [line for line in lines if line]
    return said[-1] if said else "it printed nothing"


def parse_samples(task: TaskSet, samples: list[dict[str, Any]], seconds: float) -> TaskResult:
    """The harness's item records (``log_samples``) of ``task`` as a ``TaskResult``: the
    per-item lists ``tasks.score`` keeps and the metric keys of ``tasks.stats``."""
    ordered = sorted(samples, key=lambda s: int(s["doc_id"]))
    if [int(s["doc_id"]) for s in ordered] != list(range(len(task.items))):
        raise HarnessError(
            f"task {task.name}: the harness's {len(ordered)} item records are not one for "
            f"each of the {len(task.items)} items written"
        )
    prefix = f"task/{task.name}/"
    per_item: dict[str, list[Any]]
    if task.kind == "choice":
        per_item = {
            "acc": [float(s["acc"]) for s in ordered],
            "acc_norm": [float(s["acc_norm"]) for s in ordered],
            "loglik": [[float(r[0][0]) for r in s["resps"]] for s in ordered],
        }
        metrics = {}
        for m in ("acc", "acc_norm"):
            metrics.update(stats.accuracy(per_item[m], prefix + m))
    elif task.kind == "exact":
        per_item = {
            "exact_match": [float(s["exact_match"]) for s in ordered],
            "generated": [str(s["filtered_resps"][0]) for s in ordered],
        }
        metrics = stats.accuracy(per_item["exact_match"], prefix + "exact_match")
    else:
        nats = [-float(s["resps"][0][0][0]) for s in ordered]
        # the bytes of the continuation as the harness scored it (whitespace moved)
        nbytes = [
            float(len(split_pair(*s["arguments"][0][:2])[1].encode("utf-8"))) for s in ordered
        ]
        per_item = {"bpb_nats": nats, "bytes": nbytes}
        metrics = stats.bootstrap(nats, nbytes, prefix + "bpb")
    metrics[f"{prefix}items"] = float(len(ordered))
    return TaskResult(task.name, task.kind, metrics, per_item, seconds)


def child(spec_path: str) -> None:
    """The harness process: load the model once, score each task with
    ``simple_evaluate`` (timed), print ``DONE {"task", "seconds"}`` per task (other
    lines on stdout are the harness's, which the parent logs) and write every task's
    item records to the spec's ``out`` file."""
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=spec["include_path"], include_defaults=False)
    lm = HFLM(
        pretrained=spec["model_dir"],
        device="cpu",
        dtype="float32",
        add_bos_token=True,
        max_length=spec["max_length"],
        batch_size=spec["batch_size"],
    )
    samples: dict[str, Any] = {}
    for name in spec["tasks"]:
        start = time.perf_counter()
        out = simple_evaluate(
            model=lm,
            tasks=[name],
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=0,
        )
        if out is None or name not in out.get("samples", {}):
            raise RuntimeError(f"lm-evaluation-harness returned no item records for {name}")
        samples[name] = out["samples"][name]
        done = {"task": name, "seconds": time.perf_counter() - start}
        print(DONE + json.dumps(done), flush=True)
    Path(spec["out"]).write_text(json.dumps(samples, default=str), encoding="utf-8")
