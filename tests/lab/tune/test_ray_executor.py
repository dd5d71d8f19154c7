"""Trials on Ray (``lab.tune.ray_executor``): plain functions through a local Ray of two
CPUs give what direct calls give, a task whose process dies raises ``TrialWorkerLost``,
the executor stops only a Ray it started; ``--trial-resources`` parsing; a study on a
local Ray gives the sequential study's results."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import pytest

from ledgerlm.errors import ArgumentError
from ledgerlm.extras import available
from ledgerlm.lab.tune import ray_executor as rx
from ledgerlm.lab.tune.ray_executor import (
    RayExecutor,
    TrialWorkerLost,
    parse_resources,
    task_options,
)

needs_ray = pytest.mark.skipif(
    not available("ray"), reason="ray is not installed (pip install 'ledgerlm[ray]')"
)
needs_optuna = pytest.mark.skipif(
    not available("optuna"), reason="optuna is not installed (pip install 'ledgerlm[tune]')"
)


# -- functions the tasks run -----------------------------------------------------------


@pytest.fixture(autouse=True)
def _shipped_by_value():
    """Ray's workers cannot import this test module by name (pytest put its folder on
    this process's path only): its functions travel pickled by value. ledgerlm's own
    trial functions are imported by name from the installed package."""
    if available("ray"):
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])


def polynomial(x: int, *, scale: int = 1) -> dict:
    return {"x": x, "value": scale * (x**3 - 2 * x + 7), "pid": os.getpid()}


def torch_threads() -> tuple[int, int]:
    """Torch's threads in the task, and in a run the task starts (which sets its own)."""
    import torch

    from ledgerlm.config import Recipe
    from ledgerlm.lab.build import determinism

    before = torch.get_num_threads()
    determinism(Recipe().train)
    return before, torch.get_num_threads()


def refuse(text: str) -> None:
    raise ValueError(text)


def die() -> None:
    os._exit(3)


def die_once(marker: str) -> str:
    """Dies the first time; a second attempt (a retry by Ray) would return."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return "ran again"


# -- --trial-resources ----------------------------------------------------------------


def test_resources_parse_to_amounts_and_ray_options():
    got = parse_resources("cpu=2, GPU=0.5,memory=1.5G,accel=1")
    assert got == {"cpu": 2.0, "gpu": 0.5, "memory": 1.5 * 2**30, "accel": 1.0}
    assert parse_resources("gpu=1") == {"cpu": 1.0, "gpu": 1.0}  # one CPU unless told
    assert parse_resources("memory=512MiB")["memory"] == 512 * 2**20
    assert parse_resources("memory=4096")["memory"] == 4096
    assert task_options(got) == {
        "max_retries": 0,
        "retry_exceptions": False,
        "num_cpus": 2.0,
        "num_gpus": 0.5,
        "memory": int(1.5 * 2**30),
        "resources": {"accel": 1.0},
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("cpu", "expected KEY=AMOUNT"),
        ("cpu=2,,gpu=1", "expected KEY=AMOUNT"),
        ("=2", "expected KEY=AMOUNT"),
        ("cpu=two", "cpu=two is not a number"),
        ("gpu=1G", "gpu=1G is not a number"),
        ("memory=lots", "memory=lots is not an amount of bytes"),
        ("cpu=1,CPU=2", "cpu is given twice"),
        ("cpu=0", "cpu must be positive"),
        ("gpu=-1", "is not a number"),
    ],
)
def test_bad_resources_are_one_line_naming_the_flag(text, says):
    with pytest.raises(ArgumentError) as err:
        parse_resources(text)
    line = err.value.worded({"trial_resources": "--trial-resources"})
    assert line.startswith(f"--trial-resources {text!r}: ") and says in line
    assert "\n" not in line


def test_importing_the_executor_imports_no_ray():
    code = "import sys, ledgerlm.lab.tune.ray_executor; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


# -- on a local Ray --------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of two CPUs for the tests below (each start costs seconds), started
    by the executor; the last of them shuts it down."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ledgerlm[ray]')")
    assert not ray.is_initialized()
    pool = RayExecutor({"cpu": 1}, None, num_cpus=2)
    assert pool.started and ray.cluster_resources()["CPU"] == 2
    yield pool
    pool.shutdown()


def test_plain_functions_give_what_direct_calls_give(local_ray):
    inputs = [(x, s) for x in range(-3, 5) for s in (1, 2)]
    futures = [local_ray.submit(polynomial, x, scale=s) for x, s in inputs]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    got = [f.result(timeout=120) for f in futures]
    assert [g["value"] for g in got] == [polynomial(x, scale=s)["value"] for x, s in inputs]
    assert os.getpid() not in {g["pid"] for g in got}  # ran in Ray's workers
    done = concurrent.futures.wait(futures, timeout=1)
    assert len(done.done) == len(inputs)  # concurrent.futures' own helpers read them


def test_a_functions_own_error_is_raised_as_itself(local_ray):
    with pytest.raises(ValueError, match="no such trial") as err:
        local_ray.submit(refuse, "no such trial").result(timeout=120)
    assert type(err.value) is ValueError


def test_a_task_holds_torch_threads_of_its_cpus(local_ray):
    assert local_ray.submit(torch_threads).result(timeout=120) == (1, 1)
    joined = RayExecutor({"cpu": 2})  # joins the fixture's Ray: it is running
    assert not joined.started
    assert joined.submit(torch_threads).result(timeout=120) == (2, 2)


def test_executor_leaves_a_ray_it_joined(local_ray):
    import ray

    joined = RayExecutor({"cpu": 1})
    assert joined.submit(polynomial, 2).result(timeout=120)["value"] == polynomial(2)["value"]
    joined.shutdown()
    assert ray.is_initialized()
    assert local_ray.submit(polynomial, 4).result(timeout=120)["value"] == polynomial(4)["value"]


def test_a_dead_worker_raises_trial_worker_lost_and_the_next_trial_runs(local_ray, tmp_path):
    lost = local_ray.submit(die_once, str(tmp_path / "tried"))
    with pytest.raises(TrialWorkerLost, match="Ray worker was lost"):
        lost.result(timeout=120)  # Ray ran it once: retrying is the driver's decision
    assert local_ray.submit(polynomial, 5).result(timeout=120)["value"] == polynomial(5)["value"]


def test_mutation_a_dead_worker_unrecognised_is_rays_own_error(local_ray, monkeypatch):
    """The check above has teeth: with Ray's lost-worker errors not recognised the crash
    surfaces as Ray's error, which a driver retrying on TrialWorkerLost would not retry."""
    monkeypatch.setattr(rx, "_lost_errors", lambda: ())
    error = local_ray.submit(die).exception(timeout=120)
    assert error is not None and not isinstance(error, TrialWorkerLost)


def test_resources_the_local_ray_lacks_are_refused(local_ray):
    import ray

    with pytest.raises(ArgumentError, match=r"cpu=3: the local Ray has 2, so no trial"):
        RayExecutor({"cpu": 3})
    with pytest.raises(ArgumentError, match=r"accel=1: the local Ray has 0"):
        RayExecutor({"cpu": 1, "accel": 1})
    assert ray.is_initialized()  # refused by a Ray it joined: left running


def test_executor_stops_the_ray_it_started(local_ray):
    """Last of the Ray tests: it ends the fixture's Ray."""
    import ray

    local_ray.shutdown()
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="after the Ray executor shut down"):
        local_ray.submit(polynomial, 1)


# -- a study on a local Ray ------------------------------------------------------------


@pytest.mark.slow
@needs_ray
@needs_optuna
def test_a_grid_study_on_a_local_ray_gives_the_sequential_results(tmp_path):
    """The issue's test: the grid sampler's 4 trials on the tiny recipe, run one after
    another in this process and as Ray tasks two at a time, give the same trials with
    the same statuses and validation metrics."""
    from cli_runner import TINY
    from ledgerlm.config import load_recipe
    from ledgerlm.lab.tune.run import tune
    from ledgerlm.lab.tune.study import plan_study
    from ledgerlm.workspace import Workspace

    base = load_recipe(
        TINY,
        ["train.max_steps=40", "eval.every_steps=10", "train.threads=1", "eval.target_loss=5.3"],
    )
    # trials of 40 and 10 updates: on Ray the second (10) ends before the first (40)
    grid = ["train.lr=choice:3e-3,1e-5", "train.max_steps=choice:40,10"]

    def study(name, **how):
        spec = plan_study(base, grid, trials=None, sampler="grid", pruner="none")
        return tune(spec, Workspace(tmp_path / name), **how)

    def results(record):
        return {
            tuple(sorted(t["params"].items())): (t["status"], t["metric"], t["attempt"])
            for t in record["trials"]
        }

    one = study("one")
    pool = RayExecutor({"cpu": 1}, None, num_cpus=2)
    try:
        on_ray = study("ray", workers=2, executor=pool)
    finally:
        pool.shutdown()
    assert len(on_ray["trials"]) == 4 and on_ray["complete"]
    assert results(on_ray) == results(one)
    assert {t["status"] for t in one["trials"]} == {"reached", "not reached"}
    assert os.getpid() not in {t["pid"] for t in on_ray["trials"]}  # ran in Ray's workers
    assert on_ray["best"]["overrides"] == one["best"]["overrides"]


class _FirstWorkerDies(RayExecutor):
    """The first trial's Ray worker dies (os._exit) instead of training it."""

    killed = False

    def submit(self, fn, /, *args, **kwargs):
        if not self.killed:
            self.killed = True
            return super().submit(die)
        return super().submit(fn, *args, **kwargs)


@pytest.mark.slow
@needs_ray
@needs_optuna
def test_a_trial_whose_ray_worker_dies_is_failed_and_retried_once(tmp_path):
    from cli_runner import TINY
    from ledgerlm.config import load_recipe
    from ledgerlm.lab.tune.run import tune
    from ledgerlm.lab.tune.study import plan_study
    from ledgerlm.workspace import Workspace

    base = load_recipe(TINY, ["train.max_steps=20", "eval.every_steps=10", "train.threads=1"])
    spec = plan_study(base, ["train.lr=choice:3e-3,1e-3"], sampler="grid", pruner="none")
    pool = _FirstWorkerDies({"cpu": 1}, None, num_cpus=2)
    try:
        record = tune(spec, Workspace(tmp_path / "ws"), workers=2, executor=pool)
    finally:
        pool.shutdown()
    first, *rest = record["trials"]
    assert first["status"] == "failed" and first["run"] is None and first["retried"]
    assert "TrialWorkerLost" in first["error"]
    (retry,) = [t for t in rest if t["attempt"] == 2]
    assert retry["params"] == first["params"] and retry["status"] != "failed"
    assert len(rest) == 2 and record["complete"]  # the other grid point, and the retry
    assert {tuple(t["params"].items()) for t in rest} == {
        (("train.lr", 3e-3),),
        (("train.lr", 1e-3),),
    }
