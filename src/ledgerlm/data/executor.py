"""Run one function over many shards: inline, on a local process pool, or on Ray.

Workers write their outputs to files named by shard index and return small
summaries; the caller merges summaries in shard order. Output is therefore the
same whatever the executor, the worker count or the completion order.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

EXECUTORS = ("local", "ray")


def resolve_workers(workers: int) -> int:
    return workers if workers > 0 else max(1, os.cpu_count() or 1)


def map_shards(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    executor: str = "local",
    workers: int = 0,
    on_done: Callable[[int], None] | None = None,
) -> list[Any]:
    """``[fn(*job) for job in jobs]``, in parallel; results keep the order of ``jobs``.

    ``fn`` must be a module-level function (it is pickled). ``on_done(i)`` is
    called in the caller's process as each job finishes, for progress bars.
    """
    workers = min(resolve_workers(workers), max(len(jobs), 1))
    if executor == "ray":
        return _map_ray(fn, jobs, workers, on_done)
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r} (one of {', '.join(EXECUTORS)})")
    if workers == 1 or len(jobs) <= 1:
        results = []
        for i, job in enumerate(jobs):
            results.append(fn(*job))
            if on_done:
                on_done(i)
        return results
    # spawn: the parent may hold threads (PyTorch, progress bars) that fork would copy badly
    ctx = multiprocessing.get_context("spawn")
    results: list[Any] = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                i = pending.pop(fut)
                results[i] = fut.result()
                if on_done:
                    on_done(i)
    return results


def _map_ray(fn, jobs, workers, on_done) -> list[Any]:
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ValueError(
            "executor 'ray' needs the ray package: pip install 'ledgerlm[ray]'"
        ) from err
    if not ray.is_initialized():
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    remote = ray.remote(fn)
    refs = [remote.remote(*job) for job in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(jobs)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[index[ref]] = ray.get(ref)
            if on_done:
                on_done(index[ref])
    return results
