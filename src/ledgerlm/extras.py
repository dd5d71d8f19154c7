"""Optional packages, imported where they are used and named by the extra that installs them.

A command that needs a package outside the runtime set (an HF export, a dashboard
sink, Ray, the MLPerf checker, lm-evaluation-harness) asks for it through ``require``
before it writes anything; a missing package is then one line naming the extra, not a
traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# module imported -> (distribution named in the message, ledgerlm extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "transformers": ("transformers", "hf"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow-skinny", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "ray": ("ray", "ray"),
    "optuna": ("optuna", "tune"),
    "mlperf_logging": ("mlperf-logging", "mllog"),
    "lm_eval": ("lm-eval", "lmeval"),
}


class MissingExtraError(ValueError):
    """A feature's package is not installed; the message names the extra to install."""


def missing_message(module: str, purpose: str) -> str:
    package, extra = EXTRAS[module.split(".")[0]]
    return f"{purpose} needs the {package} package: pip install 'ledgerlm[{extra}]'"


def available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a dotted name imports
    its parents)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or half-installed
        return False


def check(module: str, purpose: str) -> None:
    """Refuse early, before any work, when ``module`` is not installed."""
    if not available(module):
        raise MissingExtraError(missing_message(module, purpose))


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise ``MissingExtraError`` naming its extra."""
    try:
        importlib.import_module(module.split(".")[0])  # a blocked parent counts as missing
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(missing_message(module, purpose)) from err
