"""Where the shipped recipes live: inside the wheel, or in the source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parents[1] / "configs"
_CHECKOUT = Path(__file__).resolve().parents[3] / "configs"


def shipped_recipe(name: str) -> Path:
    for folder in (_PACKAGED, _CHECKOUT):
        path = folder / f"{name}.toml"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"shipped recipe {name!r} not found (looked in {_PACKAGED}, {_CHECKOUT})"
    )
