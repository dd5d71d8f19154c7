"""Where a study's trials run: a ``concurrent.futures.Executor``.

- one worker: this process (``InProcess``), the trial's progress shown as a run's;
- K local workers: a spawn-context process pool, each worker told it shares this machine
  with K-1 others (``LOCAL_WORLD_SIZE=K``: ``lab.build.determinism`` then gives it
  cores // K torch threads, and the memory check a K-th of the RAM);
- Ray: ``lab.tune.ray_executor.RayExecutor``, each trial a Ray task with its resources.

Every worker opens the study from its storage (``trial.run_trial``). A future that
raises means its worker broke (killed, lost): the driver marks the trial failed and
retries it once.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

EXECUTORS = ("local", "ray")


class InProcess(Executor):
    """Runs each submitted call at once, in this process, and gives a finished future.
    A ``BaseException`` that is no ``Exception`` (Ctrl-C, SIGTERM) is not kept: it ends
    the study, which the same command continues."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


def _worker_start(workers: int) -> None:
    """A pool worker's start: it shares the machine's cores and memory with the others."""
    os.environ["LOCAL_WORLD_SIZE"] = str(workers)
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def local_pool(workers: int) -> Executor:
    """``workers`` processes started by spawn (no torch or Optuna state forked over)."""
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_start,
        initargs=(workers,),
    )


def make_executor(
    kind: str,
    workers: int,
    *,
    resources: str | None = None,
    address: str | None = None,
) -> Executor:
    """The executor of ``--executor`` with ``--workers``: see the module doc.
    ``resources`` (``cpu=2,gpu=1``) and ``address`` go to Ray."""
    if kind not in EXECUTORS:
        raise ValueError(f"--executor {kind!r}: use local or ray")
    if workers < 1:
        raise ValueError(f"--workers {workers}: at least 1")
    if kind == "local":
        if resources or address:
            raise ValueError("--trial-resources and --ray-address go with --executor ray")
        return InProcess() if workers == 1 else local_pool(workers)
    from ledgerlm.extras import check

    check("ray", "ledgerlm tune --executor ray")
    try:
        from ledgerlm.lab.tune.ray_executor import RayExecutor, parse_resources
    except ModuleNotFoundError as exc:
        if exc.name != "ledgerlm.lab.tune.ray_executor":
            raise
        raise ValueError(
            "--executor ray: this ledgerlm has no Ray executor yet (lab/tune/ray_executor.py)"
        ) from None
    return RayExecutor(parse_resources(resources) if resources else None, address)
