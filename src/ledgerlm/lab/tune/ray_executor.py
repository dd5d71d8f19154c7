"""Trials as Ray tasks (``ledgerlm tune --executor ray``): a ``concurrent.futures``
executor over a local Ray or an existing cluster, so the study's driver keeps trials in
flight the same way whether they run in local processes or on Ray.

- ``RayExecutor(resources, address)`` starts a local Ray with the machine's CPUs
  (``address`` None) or joins one (``ray.init(address=...)``: ``auto``, ``HOST:PORT``
  or a Ray Client ``ray://HOST:10001``); ``submit`` runs the function as a Ray task
  holding ``resources`` (``parse_resources``: ``cpu=2,gpu=1,memory=8G``) and returns a
  ``concurrent.futures.Future``; ``shutdown`` stops the Ray only if it started it.
- A task whose process died (killed, out of memory, its node lost) raises
  ``TrialWorkerLost``, the one error class a driver retries on; Ray retries nothing
  (``max_retries=0``): whether a trial runs again is the study's decision. An error the
  function raised is raised as itself.
- A driver that dies leaves its trials RUNNING in the study; the next command finds
  each one's run in the ledger and resumes it or fails and retries it
  (``lab.tune.run``).

Workers import ledgerlm and read the workspace themselves. A local Ray shares this
machine's installed packages, environment and filesystem. On a cluster every node needs
the same ledgerlm installed and the workspace at the same path on shared storage (NFS
or similar: trials write their runs to its ledger, their checkpoints under it); the
driver's ``LEDGERLM_*`` environment variables travel with each task. Importing this
module imports no Ray: a driver names ``TrialWorkerLost`` without the extra installed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from ledgerlm.errors import ArgumentError
from ledgerlm.extras import require

# ``--trial-resources`` keys with a Ray task option of their own; any other key is a
# custom resource of the cluster's nodes (``ray start --resources``).
RESOURCE_OPTIONS = {"cpu": "num_cpus", "gpu": "num_gpus", "memory": "memory"}
DEFAULT_RESOURCES = {"cpu": 1.0}
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AMOUNT = re.compile(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


class TrialWorkerLost(RuntimeError):
    """The process that ran a trial died before it returned (killed, out of memory, its
    node lost): the trial's own code raised nothing, so the driver may run it again."""


def parse_resources(text: str) -> dict[str, float]:
    """``cpu=2,gpu=1,memory=8G,accel=1`` as ``{"cpu": 2.0, "gpu": 1.0, "memory":
    8589934592.0, "accel": 1.0}``: what one trial holds. ``memory`` is in bytes (a K, M,
    G or T suffix counts powers of 1024); another key is a custom resource. No ``cpu``
    means one CPU."""
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key or not value:
            raise ArgumentError(
                "{trial_resources} {text}: expected KEY=AMOUNT[,KEY=AMOUNT...] "
                "(e.g. cpu=2,gpu=1,memory=8G), got {item}",
                text=repr(text),
                item=repr(item.strip()),
            )
        key = key.lower()
        if key in out:
            raise ArgumentError(
                "{trial_resources} {text}: {key} is given twice", text=repr(text), key=key
            )
        match = _AMOUNT.fullmatch(value)
        if match is None or (match.group(2) and key != "memory"):
            what = "an amount of bytes (e.g. 8G)" if key == "memory" else "a number"
            raise ArgumentError(
                "{trial_resources} {text}: {key}={value} is not " + what,
                text=repr(text),
                key=key,
                value=value,
            )
        amount = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if amount < 0 or (key == "cpu" and amount == 0):
            raise ArgumentError(
                "{trial_resources} {text}: {key} must be "
                + ("positive" if key == "cpu" else "0 or more"),
                text=repr(text),
                key=key,
            )
        out[key] = amount
    return {**DEFAULT_RESOURCES, **out}


def task_options(resources: dict[str, float]) -> dict[str, Any]:
    """Ray's task options for ``resources`` (``parse_resources``'s keys)."""
    options: dict[str, Any] = {"max_retries": 0, "retry_exceptions": False}
    custom = {}
    for key, amount in {**DEFAULT_RESOURCES, **resources}.items():
        if key in RESOURCE_OPTIONS:
            options[RESOURCE_OPTIONS[key]] = int(amount) if key == "memory" else amount
        else:
            custom[key] = amount
    if custom:
        options["resources"] = custom
    return options


def _lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a task whose process or node went away, not for its code."""
    from ray import exceptions as rx

    return (
        rx.WorkerCrashedError,
        rx.NodeDiedError,
        rx.LocalRayletDiedError,
        rx.OutOfMemoryError,
        rx.ObjectLostError,  # the result lost with its node (OwnerDiedError among them)
    )


def _in_worker(fn: Callable[..., Any], threads: int, args: tuple, kwargs: dict) -> Any:
    """A task's body: torch's intra-op threads set to the task's CPUs, then ``fn``. A
    run sets its threads again (``lab.build.determinism``: the node's cores over
    ``LOCAL_WORLD_SIZE``), so the task says it shares the node with cores // CPUs
    others, as a local pool's worker does (``lab.tune.executors``); Ray sets
    ``OMP_NUM_THREADS`` alike for libraries that read it."""
    os.environ["LOCAL_WORLD_SIZE"] = str(max(1, (os.cpu_count() or 1) // threads))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
    return fn(*args, **kwargs)


class RayExecutor(concurrent.futures.Executor):
    """Each ``submit`` a Ray task holding ``resources`` (see the module's text).

    ``num_cpus``/``num_gpus`` size a Ray this executor starts (default: the machine's);
    ``runtime_env`` is merged into the one given to a joined cluster (which carries the
    driver's ``LEDGERLM_*`` variables); ``init_options`` go to ``ray.init`` as they are.
    ``threads`` (torch's intra-op threads in a task) is the task's whole CPUs.
    ``started``: whether this executor called ``ray.init`` (and so ``ray.shutdown``);
    a Ray this process already runs is used as it is."""

    def __init__(
        self,
        resources: dict[str, float] | None = None,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        runtime_env: dict[str, Any] | None = None,
        log_to_driver: bool = False,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        ray = require("ray", "--executor ray")
        self.resources = {**DEFAULT_RESOURCES, **(resources or {})}
        self.address = address
        self.threads = max(1, int(self.resources["cpu"]))
        options = {"include_dashboard": False, "log_to_driver": log_to_driver}
        options |= {"configure_logging": False, "logging_level": logging.WARNING}
        options |= init_options or {}
        self.started = False
        if not ray.is_initialized():
            if address is None:
                cpus = num_cpus or os.cpu_count() or 1
                ray.init(num_cpus=cpus, num_gpus=num_gpus, **options)
            else:
                options.pop("include_dashboard")
                env = _driver_env(runtime_env)
                ray.init(address=address, **({"runtime_env": env} if env else {}), **options)
            self.started = True
        if address is None:  # a Ray of this machine: what it holds is all it will hold
            self._check_fits(ray.cluster_resources())
        self._remote = ray.remote(_in_worker).options(**task_options(self.resources))
        self._lock = threading.Lock()
        self._live: dict[concurrent.futures.Future, Any] = {}
        self._closed = False

    def _check_fits(self, total: dict[str, float]) -> None:
        """Refuse resources a local Ray can never grant (its task would wait forever),
        stopping the Ray if this executor started it."""
        names = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}
        for key, amount in self.resources.items():
            have = float(total.get(names.get(key, key), 0.0))
            if amount > have:
                if self.started:
                    self._stop()
                raise ArgumentError(
                    "{trial_resources} {key}={amount:g}: the local Ray has {have:g}, so no "
                    "trial could start (give fewer, or join a cluster with --ray-address)",
                    key=key,
                    amount=amount,
                    have=have,
                )

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit a trial after the Ray executor shut down")
            ref = self._remote.remote(fn, self.threads, args, kwargs)
            future: concurrent.futures.Future = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # queued on Ray: cancelled by shutdown
            self._live[future] = ref
        ref.future().add_done_callback(lambda done: self._settle(future, done))
        return future

    def _settle(self, future: concurrent.futures.Future, done: concurrent.futures.Future) -> None:
        with self._lock:
            self._live.pop(future, None)
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # shutdown settled it
            _settle(future, done)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking trials; with ``cancel_futures`` end the unfinished ones; with
        ``wait`` wait for the rest. A local Ray this executor started is stopped (its
        running tasks end: their futures raise ``TrialWorkerLost``), a cluster it
        connected to is disconnected from (the cluster runs on), and a Ray this process
        already had is left as it was."""
        import ray

        with self._lock:
            self._closed = True
            live = dict(self._live)
        if cancel_futures:
            for ref in live.values():
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        if wait:
            concurrent.futures.wait(list(live))
        if self.started:
            self._stop()
        for future in live:
            if not future.done():
                future.set_exception(TrialWorkerLost("the Ray executor shut down first"))

    def _stop(self) -> None:
        import ray

        ray.shutdown()
        self.started = False


def _settle(future: concurrent.futures.Future, done: concurrent.futures.Future) -> None:
    """Give ``future`` the Ray task's outcome (``done``), its errors as a driver reads
    them."""
    from ray.exceptions import RayTaskError, TaskCancelledError

    exc = done.exception()
    if exc is None:
        future.set_result(done.result())
    elif isinstance(exc, _lost_errors()):
        lost = TrialWorkerLost(f"a trial's Ray worker was lost: {_first_line(exc)}")
        lost.__cause__ = exc
        future.set_exception(lost)
    elif isinstance(exc, TaskCancelledError):
        future.set_exception(concurrent.futures.CancelledError(_first_line(exc)))
    elif isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException):
        future.set_exception(exc.cause)  # the function's own error, as it raised it
    else:
        future.set_exception(exc)


def _driver_env(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """The runtime environment of a joined cluster's tasks: ``runtime_env`` with the
    driver's ``LEDGERLM_*`` variables among its ``env_vars``."""
    env = dict(runtime_env or {})
    ours = {k: v for k, v in os.environ.items() if k.startswith("LEDGERLM_")}
    if ours:
        env["env_vars"] = {**ours, **env.get("env_vars", {})}
    return env


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
