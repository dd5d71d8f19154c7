"""Shared by tests of the data stage: the ``[data]`` table of a test's own small files,
built in one place so each test says only what it changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledgerlm.config import DataConfig, InputConfig

NO_TEMPLATES = {"enabled": False}  # no line is removed as a template (banner, header, footer)


def data_config(
    *sources: str | Path | InputConfig | dict[str, Any],
    domain: str | None = None,
    val_fraction: float | None = 0.2,
    **keys: Any,
) -> DataConfig:
    """The data stage of ``sources`` (a path or glob each, of ``domain`` when given, or an
    ``InputConfig`` or its table as it is) with one worker and ``val_fraction`` of the
    units held out for validation (None: the stage's own default), the other ``keys`` as
    a recipe's ``[data]`` table writes them."""
    table: dict[str, Any] = {"sources": [_source(s, domain) for s in sources], "workers": 1}
    if val_fraction is not None:
        table["val_fraction"] = val_fraction
    return DataConfig.model_validate({**table, **keys})


def _source(source: str | Path | InputConfig | dict[str, Any], domain: str | None) -> Any:
    if not isinstance(source, str | Path):
        return source
    return InputConfig(path=str(source), **({"domain": domain} if domain else {}))
