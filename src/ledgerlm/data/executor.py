"""Run one function over many shards: inline, on a local process pool, or on Ray.

Workers write their outputs to files named by shard index and return small
summaries; the caller merges summaries in shard order. Output is therefore the
same whatever the executor, the worker count or the completion order.

A build runs several passes over the same shards; ``ShardPool`` keeps one set of
worker processes for all of them, so the workers start (and import numpy, pyarrow
and the passes) once per build, not once per pass.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from ledgerlm.extras import require

EXECUTORS = ("local", "ray")
# What a fresh worker needs; the fork server imports it once and every worker it forks
# starts with it loaded. ``__main__`` too: a worker otherwise runs the parent's main
# script again (for the ``ledgerlm`` command, importing the whole command line).
_PRELOAD = ["__main__", "ledgerlm.data.worker_init"]


def resolve_workers(workers: int) -> int:
    return workers if workers > 0 else max(1, os.cpu_count() or 1)


def _context() -> multiprocessing.context.BaseContext:
    """A fork server where there is one (Linux, macOS), else spawn.

    Not plain fork: the caller may hold threads (PyTorch, progress bars, pyarrow's
    pools) that a forked child would inherit half-copied. The fork server is a fresh
    single-threaded interpreter that imports ``_PRELOAD`` once; each worker is forked
    from it, so starting one costs milliseconds instead of an interpreter start and
    half a second of imports (spawn).
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


# Plain JSONL files are cut into pieces of at least this many bytes, Parquet files into
# runs of row groups of at least this many uncompressed bytes (``read.pieces.split_shards``),
# so that one big file keeps every worker busy. A constant, not a function of the worker
# count: the cuts, and with them every output file, are the same however many workers
# read them.
PIECE_BYTES = 4 << 20


def start_workers(executor: str = "local", workers: int = 0) -> None:
    """Start the fork server now, when a build will want local workers: it imports
    what they need while the caller goes on (reading the recipe, importing the data
    stage, hashing the inputs), so the first pass finds it ready. Costs nothing to
    wait for; if no pass runs after all (a reused version), the server just exits with
    the caller."""
    if executor != "local" or resolve_workers(workers) < 2:
        return
    if _context().get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def likely_parallel(paths: Sequence[str], base: str = ".") -> bool:
    """Whether inputs named by ``paths`` (files, folders or globs) probably make more
    than one shard: two files or more, or one big enough to be cut (a quarter of
    ``PIECE_BYTES``, see ``read.pieces.piece_size``). From names and sizes only (no file is
    read), for deciding early whether to ``start_workers``."""
    import glob

    files, size = 0, 0
    for path in paths:
        if path.startswith("builtin:"):
            files += 1
            continue
        full = path if os.path.isabs(path) else os.path.join(base, path)
        for match in glob.glob(full, recursive=True) or [full]:
            if os.path.isdir(match):
                return True  # a folder of text files (or a datasets folder)
            try:
                size += os.path.getsize(match)
            except OSError:
                continue
            files += 1
        if files > 1 or size > PIECE_BYTES // 4:
            return True
    return False


class ShardPool:
    """Worker processes shared by the passes of one build (a context manager).

    ``workers`` is resolved (0 = all cores) and capped by ``max_jobs``, the most jobs
    any pass will have; with one worker (or on Ray) no local process is started and
    jobs run inline (or as Ray tasks).
    """

    def __init__(self, executor: str = "local", workers: int = 0, max_jobs: int = 0) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"unknown executor {executor!r} (one of {', '.join(EXECUTORS)})")
        self.executor = executor
        self.workers = min(resolve_workers(workers), max(max_jobs, 1))
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> ShardPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(abandon=exc_type is not None)

    def close(self, abandon: bool = False) -> None:
        """Stop the workers. ``abandon`` (the build is failing or interrupted: a job's
        error, Ctrl-C, a signal handled as an exception): kill them at once instead of
        waiting for the jobs they are running."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            if abandon:  # the pool sees its workers die and fails their futures
                _kill_workers(pool)
            pool.shutdown(wait=True, cancel_futures=not abandon)
            _stop_fork_server()

    def map(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[tuple],
        on_done: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """``[fn(*job) for job in jobs]``, in parallel; results keep the order of ``jobs``.

        ``fn`` must be a module-level function (it is pickled). ``on_done(i)`` is
        called in the caller's process as each job finishes, for progress bars.
        """
        workers = min(self.workers, max(len(jobs), 1))
        if self.executor == "ray":
            return _map_ray(fn, jobs, workers, on_done)
        if workers == 1 or len(jobs) <= 1:
            results = []
            for i, job in enumerate(jobs):
                results.append(fn(*job))
                if on_done:
                    on_done(i)
            return results
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=_context(),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
        results: list[Any] = [None] * len(jobs)
        pending: dict[Future, int] = {self._pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    results[i] = fut.result()
                    if on_done:
                        on_done(i)
        except BaseException:  # a job failed, or the caller was interrupted: stop the rest
            self.close(abandon=True)
            raise
        return results


# Linux's prctl option for the signal a process gets when its parent ends.
_PR_SET_PDEATHSIG = 1
# How often a worker's watchdog looks for its parent and its owner.
_WATCH_SECONDS = 0.5


def die_with_parent() -> None:
    """Have the kernel kill this process (SIGKILL) when its parent ends: Linux's
    parent-death signal. Elsewhere nothing; the watchdog of ``_start_worker`` covers
    the workers there, and the fork server exits once its workers are gone.

    The "parent" is the thread that started the process: the fork server must be
    started (``start_workers``, a pool's first job) by a thread that outlives the pool.
    """
    if not sys.platform.startswith("linux"):
        return  # pragma: no cover - Linux only
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _start_worker(owner: int) -> None:
    """What a local worker runs first, so that it never outlives the build that started
    it (``owner``, the process holding the pool): a parent-death signal tied to the fork
    server (itself killed with the owner, ``worker_init``), and a watchdog thread that
    ends the worker when its parent changes or the owner is gone or a zombie, wherever
    there is no such signal (and if the parent died before the signal was set). Ctrl-C
    is the owner's to handle (it kills the pool, ``ShardPool.close``), and nothing a
    worker prints reaches the owner's output: a worker never holds the owner's stdout.
    """
    import psutil

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    parent = os.getppid()
    try:
        process = psutil.Process(owner)
    except psutil.Error:
        os._exit(1)
    threading.Thread(
        target=_watch, args=(parent, process), name="ledgerlm-watchdog", daemon=True
    ).start()


def _watch(parent: int, owner: Any) -> None:
    import psutil

    while True:
        try:
            alive = owner.is_running() and owner.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if not alive or os.getppid() != parent:
            os._exit(1)
        time.sleep(_WATCH_SECONDS)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's workers, those the fork server forked that the pool has no record
    of yet (an interrupt can land between asking for a worker and recording it), and the
    fork server itself, which could still fork one: nothing is left that
    ``_stop_fork_server`` would wait for."""
    import psutil

    pids = [p.pid for p in list((getattr(pool, "_processes", None) or {}).values())]
    server = _fork_server()
    if server is not None:
        with contextlib.suppress(psutil.Error):
            pids = [server, *pids, *(c.pid for c in psutil.Process(server).children())]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _fork_server() -> int | None:
    """The pid of this process's fork server, if one was started."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def _stop_fork_server(patience: float = 5.0) -> None:
    """Stop the fork server once a build's workers are gone: otherwise it idles, holding
    the preloaded modules (~150 MB), for as long as the caller lives (a training run),
    and is left for the system to reap. Closing its "alive" pipe asks it to exit, as the
    standard library's own ``_stop`` does; unlike ``_stop`` this never waits forever (a
    worker forked at the moment of an interrupt can still hold the pipe): after
    ``patience`` seconds the server is killed. A later pool simply starts a new one."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = _fork_server()
    lock = getattr(server, "_lock", None)
    if pid is None or lock is None or not lock.acquire(timeout=patience):
        return
    try:
        with contextlib.suppress(OSError, TypeError):
            os.close(server._forkserver_alive_fd)
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    time.sleep(0.02)
                    continue
            break
        else:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        address = server._forkserver_address
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
        with contextlib.suppress(OSError, TypeError, ValueError):
            os.unlink(address)  # an abstract socket (a name starting with NUL) has no file
    finally:
        lock.release()


def _map_ray(fn, jobs, workers, on_done) -> list[Any]:
    ray = require("ray", "executor 'ray'")
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
