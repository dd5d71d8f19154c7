"""The study's driver: Optuna's ask-and-tell loop over trials run by an executor.

``tune`` asks the study for a trial, hands it to the executor (at most ``workers`` in
flight), and tells the study each result as it comes back: a value, PRUNED or FAIL.
The record (``tune/<study>/study.json``) is written before the first trial, as each
trial starts and as each ends, with the study's wall time (every command's, summed)
and device time (its trial runs', summed).

A study survives a kill: the same command continues it. Finished trials never run
again; a trial the storage holds as RUNNING whose run has no live process resumes from
its checkpoint (``continue_run``); one without a checkpoint (or no run at all) is
marked failed and retried once, with the same params (``attempt`` 2, a new trial
number). A trial whose worker broke (a future that raised) is failed and retried too.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ledgerlm.extras import check
from ledgerlm.lab.tune.executors import InProcess, make_executor
from ledgerlm.lab.tune.record import (
    StudyClock,
    put_trial,
    start_record,
    write_record,
)
from ledgerlm.lab.tune.space import overrides
from ledgerlm.lab.tune.study import StudySpec, open_study, storage_url
from ledgerlm.lab.tune.trial import TrialSpec, result_row, run_trial
from ledgerlm.progress import Named, NullProgress, Progress
from ledgerlm.workspace import Workspace


def attempt_of(trial: Any) -> int:
    """A trial's attempt: 2 for the retry of a failed one, whether this driver queued it
    (``attempt`` user attribute) or Optuna's heartbeat did (``retry_history``)."""
    history = trial.system_attrs.get("retry_history")
    if history:
        return 1 + len(history)
    return int(trial.user_attrs.get("attempt", 1))


def retry_of(trial: Any) -> int | None:
    """The number of the failed trial a retry stands for (None for a first attempt)."""
    found = trial.user_attrs.get("retry_of", trial.system_attrs.get("failed_trial"))
    return None if found is None else int(found)


class _Driver:
    """One command's work on a study (see the module doc)."""

    def __init__(self, spec: StudySpec, workspace: Workspace, progress: Progress) -> None:
        self.spec, self.workspace, self.progress = spec, workspace, progress
        self.record = start_record(workspace, spec.study, spec.plan, spec.objective)
        self.clock = StudyClock(self.record)
        self.url = storage_url(spec, workspace)
        self.study = open_study(spec, self.url)
        self.distributions = {p.key: p.distribution() for p in spec.params}
        self.base = spec.base.to_dict()

    # -- trials and rows ------------------------------------------------------------

    def trial_spec(self, number: int, trial_id: int, params: dict, attempt: int) -> TrialSpec:
        return TrialSpec(
            study=self.spec.study,
            storage=self.url,
            workspace=str(self.workspace.root.resolve()),  # a worker may start elsewhere
            number=number,
            trial_id=trial_id,
            base=self.base,
            overrides=overrides(self.spec.params, params),
            params=dict(params),
            objective=self.spec.objective,
            pruner=self.spec.pruner,
            attempt=attempt,
        )

    def of_frozen(self, frozen: Any) -> TrialSpec:
        return self.trial_spec(frozen.number, frozen._trial_id, frozen.params, attempt_of(frozen))

    def save(self, row: dict[str, Any]) -> None:
        put_trial(self.record, row)
        self.clock.stamp(self.record)
        write_record(self.workspace, self.record)

    def _run(self, name: str) -> dict[str, Any] | None:
        from ledgerlm.ledger.store import Ledger

        if not self.workspace.ledger_path.is_file():
            return None
        with Ledger(self.workspace.ledger_path) as ledger:
            return next((r for r in ledger.list_runs() if r["name"] == name), None)

    def _summary(self, run: dict[str, Any] | None) -> dict[str, Any] | None:
        from ledgerlm.ledger.store import Ledger

        if run is None:
            return None
        with Ledger(self.workspace.ledger_path) as ledger:
            return ledger.run_summary(run["id"])

    def fail(self, ts: TrialSpec, why: str) -> dict[str, Any]:
        """Tell the study the trial failed, end its run as failed in the ledger when no
        process trains it, and retry it once (same params, the next attempt)."""
        from optuna.trial import TrialState

        from ledgerlm.lab.status import interrupted
        from ledgerlm.ledger.store import Ledger

        run = self._run(ts.name)
        if run is not None and run["status"] == "running" and interrupted(self.workspace, run):
            with Ledger(self.workspace.ledger_path) as ledger:
                ledger.close_open_phases(run["id"], "tune")
                ledger.finish_run(run["id"], "failed")
        row = result_row(ts, self._summary(self._run(ts.name)), why)
        self.tell(ts.number, None, TrialState.FAIL)
        if ts.attempt == 1:
            self.study.enqueue_trial(ts.params, user_attrs={"attempt": 2, "retry_of": ts.number})
            row["retried"] = True
        return row

    def tell(self, number: int, value: float | None, state: Any = None) -> None:
        try:
            self.study.tell(number, value, state=state, skip_if_finished=True)
        except RuntimeError:  # the grid sampler stops the study after its last point
            if self.spec.plan["sampler"] != "grid":
                raise

    # -- the loop -------------------------------------------------------------------

    def recover(self) -> list[TrialSpec]:
        """Trials a killed command left: rows brought up to date with the storage, and
        the RUNNING trials to resume (the others failed and retried)."""
        from optuna.trial import TrialState

        from ledgerlm.lab.resume import has_checkpoint
        from ledgerlm.lab.status import interrupted

        rows = {t["number"]: t for t in self.record["trials"]}
        resume: list[TrialSpec] = []
        for frozen in self.study.get_trials(deepcopy=False):
            if frozen.state == TrialState.WAITING:
                continue
            ts = self.of_frozen(frozen)
            if frozen.state.is_finished():
                if rows.get(frozen.number, {}).get("status", "running") == "running":
                    error = "failed" if frozen.state == TrialState.FAIL else None
                    self.save(result_row(ts, self._summary(self._run(ts.name)), error))
                continue
            if set(frozen.params) != set(self.distributions):  # killed inside ask
                self.tell(frozen.number, None, TrialState.FAIL)
                continue
            run = self._run(ts.name)
            if (
                run is not None
                and run["status"] == "running"
                and not interrupted(self.workspace, run)
            ):
                continue  # another command trains it
            if run is not None and (
                run["status"] != "running" or has_checkpoint(self.workspace, run["id"])
            ):
                resume.append(ts)
            else:
                self.save(self.fail(ts, "interrupted before its first checkpoint"))
        return resume

    def next_trial(self) -> TrialSpec | None:
        """A new trial (a retry waiting first), or None once the plan's are asked."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        first = sum(1 for t in trials if attempt_of(t) == 1)
        if not waiting and first >= self.spec.trials:
            return None
        trial = self.study.ask(self.distributions)
        frozen = self.study._storage.get_trial(trial._trial_id)
        attempt = attempt_of(frozen)
        if attempt == 1:
            trial.set_user_attr("attempt", 1)
        elif self.spec.plan["sampler"] == "grid":  # the retry stands for the same grid point
            original = next(t for t in trials if t.number == retry_of(frozen))
            for key in ("search_space", "grid_id"):
                if key in original.system_attrs:
                    value = original.system_attrs[key]
                    self.study._storage.set_trial_system_attr(trial._trial_id, key, value)
        return self.trial_spec(trial.number, trial._trial_id, trial.params, attempt)

    def finish(self, future: Future, ts: TrialSpec) -> dict[str, Any]:
        from optuna.trial import TrialState

        try:
            row = future.result()
        except Exception as exc:  # the worker broke, not the trial
            return self.fail(ts, " ".join(f"worker lost: {type(exc).__name__}: {exc}".split()))
        states = {"pruned": TrialState.PRUNED, "failed": TrialState.FAIL}
        if row["status"] in states:
            self.tell(ts.number, None, states[row["status"]])
        else:
            self.tell(ts.number, row["value"])
        return row


def tune(
    spec: StudySpec,
    workspace: Workspace,
    progress: Progress | None = None,
    *,
    workers: int = 1,
    executor: str | Executor = "local",
    resources: str | None = None,
    ray_address: str | None = None,
    on_trial: Any = None,
) -> dict[str, Any]:
    """Run (or continue) the study ``spec`` (``study.plan_study``) and give its record.

    ``workers``: trials in flight at once; ``executor``: ``local`` (this process for one
    worker, a process pool for more), ``ray`` (with a trial's ``resources``, as
    ``cpu=2,gpu=1``, and ``ray_address``), or an ``Executor``. ``on_trial(row)`` is
    called as each trial ends, with its record row."""
    from ledgerlm.train.distributed import one_process

    check("optuna", "ledgerlm tune")
    one_process()  # under torchrun every rank would run the whole study
    progress = progress or NullProgress()
    options = {"resources": resources, "address": ray_address}
    made = isinstance(executor, str)
    pool = make_executor(executor, workers, **options) if made else executor
    driver = _Driver(spec, workspace, progress)
    queue = driver.recover()
    in_flight: dict[Future, TrialSpec] = {}
    broken = False  # a broken process pool takes no more work: a new one, once it is idle
    try:
        with progress.task(f"tune {spec.study}", total=spec.trials) as task:
            while True:
                while not broken and len(in_flight) < workers:
                    ts = queue.pop(0) if queue else driver.next_trial()
                    if ts is None:
                        break
                    driver.save({**result_row(ts, None, None), "status": "running"})
                    extra = {}
                    if isinstance(pool, InProcess):
                        extra["progress"] = Named(progress, ts.name)
                    try:
                        in_flight[pool.submit(run_trial, ts, **extra)] = ts
                    except BrokenProcessPool:  # a worker died before its future says so
                        queue.insert(0, ts)  # submitted again to the new pool
                        broken = True
                if not in_flight and not broken:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: in_flight[f].number):
                    ts = in_flight.pop(future)
                    broken = broken or isinstance(future.exception(), BrokenProcessPool)
                    row = driver.finish(future, ts)
                    driver.save(row)
                    task.advance(1, info=f"{ts.name} {row['status']}")
                    if on_trial is not None:
                        on_trial(row)
                if broken and not in_flight:
                    if not made:
                        raise RuntimeError("the executor's process pool broke: run it again")
                    pool.shutdown(wait=True)
                    pool = make_executor(executor, workers, **options)
                    broken = False
        # complete unless a trial another command trains is still running
        driver.record["complete"] = all(t["status"] != "running" for t in driver.record["trials"])
    finally:
        driver.clock.stamp(driver.record)
        write_record(workspace, driver.record)
        if made:
            pool.shutdown(wait=True, cancel_futures=True)
    return driver.record
