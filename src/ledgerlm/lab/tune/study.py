"""A study's plan, its id, and the Optuna study in its storage.

The plan is what determines a study: the base recipe's digest (its seed included), the
params, the sampler, the pruner with its settings, the sampler's seed, the objective and
the number of trials. Its id is ``<recipe>-tune-<6 hex of the plan>`` unless named
(``--study NAME``), so the same command continues the same study, and a different plan
under a name already used is refused (``record.start_record``).

The Optuna study lives in ``tune/<study>/journal.log`` (Optuna's journal file, which
processes of one machine, or of several sharing a file system that supports its lock,
may write at once), or in an RDB given by URL (``postgresql://``, ``mysql://``;
``sqlite:///`` serves one machine only, as Optuna advises). Both objectives are
minimised: a time in device-seconds, or a validation loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledgerlm.config import NAME_MAX, NAME_RULE, Recipe, is_name, shown
from ledgerlm.errors import ArgumentError
from ledgerlm.lab.tune.record import plan_digest, trial_name
from ledgerlm.lab.tune.space import Param, grid, grid_size, parse_space
from ledgerlm.workspace import Workspace

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("asha", "median", "none")
OBJECTIVES = ("time", "metric")
JOURNAL = "journal.log"


@dataclass(frozen=True)
class StudySpec:
    """A study to run: its base recipe, params and plan, its id and where Optuna keeps
    it (``storage``: a URL, or None for the workspace's journal file)."""

    base: Recipe
    params: list[Param]
    plan: dict[str, Any]
    study: str
    storage: str | None = None
    pruner: dict[str, Any] = field(default_factory=dict)

    @property
    def trials(self) -> int:
        return int(self.plan["trials"])

    @property
    def objective(self) -> str:
        return str(self.plan["objective"])


def pruner_settings(kind: str, base: Recipe, trials: int, **given: Any) -> dict[str, Any]:
    """The pruner's settings, kept in the plan. ``asha`` (Optuna's
    SuccessiveHalvingPruner, asynchronous): rungs from the first evaluation
    (``min_resource`` = ``eval.every_steps``), a third promoted at each
    (``reduction_factor`` 3). ``median``: a trial whose metric is worse than the median
    of the finished trials at the same step is stopped, from the first evaluation on,
    once a quarter of the trials (1 to 5) finished. ``none``: no pruning. ``given``
    overrides a setting."""
    if kind not in PRUNERS:
        raise ArgumentError("{pruner} {kind}: use asha, median or none", kind=repr(kind))
    every = base.eval.every_steps
    if kind == "asha":
        settings = {"min_resource": every, "reduction_factor": 3}
    elif kind == "median":
        settings = {"startup_trials": max(1, min(5, trials // 4)), "warmup_steps": every}
    else:
        settings = {}
    unknown = sorted(set(given) - set(settings))
    if unknown:
        raise ValueError(f"pruner {kind}: no setting {unknown[0]!r} (it has {sorted(settings)})")
    return {"kind": kind, **settings, **given}


def plan_study(
    base: Recipe,
    param_lines: list[str],
    *,
    trials: int | None = 16,
    sampler: str = "tpe",
    pruner: str | dict[str, Any] = "asha",
    objective: str = "time",
    seed: int | None = None,
    study: str | None = None,
    storage: str | None = None,
) -> StudySpec:
    """Check the study's settings against the recipe (before anything is written) and
    give its plan and id. ``trials``: how many (None with the grid sampler: the whole
    grid; more than the grid is cut to it); ``seed``: the sampler's (default: the
    recipe's ``train.seed``); ``pruner``: a name or settings (``pruner_settings``)."""
    if sampler not in SAMPLERS:
        raise ArgumentError("{sampler} {kind}: use tpe, random or grid", kind=repr(sampler))
    if objective not in OBJECTIVES:
        raise ArgumentError("{objective} {kind}: use time or metric", kind=repr(objective))
    params = parse_space(param_lines, base)
    if sampler == "grid":
        size = grid_size(params)  # refuses a float or log param
        trials = size if trials is None else min(trials, size)
    if trials is None or trials < 1:
        raise ArgumentError("{trials}: at least 1")
    given = {"kind": pruner} if isinstance(pruner, str) else dict(pruner)
    settings = pruner_settings(given.pop("kind"), base, trials, **given)
    plan = {
        "base_recipe": base.name,
        "base_recipe_sha256": base.digest(),
        "params": [p.to_dict() for p in params],
        "sampler": sampler,
        "pruner": settings,
        "seed": base.train.seed if seed is None else seed,
        "objective": objective,
        "trials": trials,
    }
    found = study or f"{base.name}-tune-{plan_digest(plan)[:6]}"
    # retries take numbers after the plan's: room for twice as many trials
    if not is_name(found) or len(trial_name(found, 2 * trials)) > NAME_MAX:
        raise ArgumentError(
            "{study} {name}: expected a name of " + NAME_RULE + " (its trials add -tNN)",
            name=shown(found),
        )
    return StudySpec(base, params, plan, found, storage, settings)


def storage_url(spec: StudySpec, workspace: Workspace) -> str:
    """Where Optuna keeps the study, as every worker opens it: the URL given, else
    ``journal:<absolute path of tune/<study>/journal.log>``."""
    if spec.storage:
        return spec.storage
    path = workspace.study_dir(spec.study) / JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"journal:{path.resolve()}"


def open_storage(url: str) -> Any:
    """Optuna's storage for ``url`` (``journal:PATH`` or an RDB URL)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url.startswith("journal:"):
        return JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    try:
        return optuna.storages.RDBStorage(url)
    except (ImportError, optuna.exceptions.OptunaError) as exc:  # no driver, a bad URL
        raise ValueError(f"--storage {url!r}: {_first_line(exc)}") from None
    except Exception as exc:  # SQLAlchemy's own errors (an unparsable URL, no server)
        if type(exc).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise ValueError(f"--storage {url!r}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_sampler(spec: StudySpec) -> Any:
    """The plan's sampler, seeded. TPE uses Optuna's defaults (10 random trials first)
    with a constant liar, so parallel workers do not all draw near the same point."""
    import optuna

    kind, seed = spec.plan["sampler"], int(spec.plan["seed"])
    if kind == "grid":
        return optuna.samplers.GridSampler(grid(spec.params), seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def make_pruner(settings: dict[str, Any]) -> Any:
    """Optuna's pruner for the plan's settings (``pruner_settings``)."""
    import optuna

    kind = settings["kind"]
    if kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=int(settings["min_resource"]),
            reduction_factor=int(settings["reduction_factor"]),
        )
    if kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(settings["startup_trials"]),
            n_warmup_steps=int(settings["warmup_steps"]),
        )
    return optuna.pruners.NopPruner()


def quiet_optuna() -> None:
    """Optuna's own INFO lines (a line per trial) off: the command prints its own."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_study(spec: StudySpec, url: str) -> Any:
    """The Optuna study (created on first use), minimised, with the plan's sampler and
    pruner."""
    import optuna

    quiet_optuna()
    return optuna.create_study(
        study_name=spec.study,
        storage=open_storage(url),
        sampler=make_sampler(spec),
        pruner=make_pruner(spec.pruner),
        direction="minimize",
        load_if_exists=True,
    )
