"""A default a command shows in its ``--help`` is the library's: the scale and mix
commands' option defaults are written beside the options (the CLI imports no numpy at
start-up, where the library's constants live), so each is checked against the
default of the library argument it is passed to."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from ledgerlm.cli import mix_fit, scale_fit, scale_serving


def _default(fn: Callable, name: str):
    return inspect.signature(fn).parameters[name].default


def _pairs():
    from ledgerlm.lab.mix_fit import fit_table
    from ledgerlm.lab.scaling.fit import FitOptions
    from ledgerlm.lab.scaling.points import load_points
    from ledgerlm.lab.scaling.recommend import check_budget, recommend
    from ledgerlm.lab.serving import measure_serving

    fit_fields = {"bootstrap": "n_boot", "seed": "seed", "drop_top_loss": "drop_top_loss",
                  "holdout_top": "holdout_top"}  # fmt: skip
    for command in (scale_fit.fit_cmd, scale_fit.recommend_cmd):
        for option, field in fit_fields.items():
            if option in inspect.signature(command).parameters:
                yield command, option, _default(FitOptions, field)
        yield command, "params", _default(load_points, "params")
    for library in (check_budget, recommend):
        yield scale_fit.recommend_cmd, "tokens_per_request", _default(library, "tokens_per_request")
    for option in ("model", "folds", "seed", "candidates"):
        yield mix_fit.fit, option, _default(fit_table, option)
    for option in ("new_tokens", "repeats"):
        yield scale_serving.serving_cost_cmd, option, _default(measure_serving, option)


def test_the_commands_show_the_librarys_defaults():
    pairs = list(_pairs())
    assert len(pairs) == 17
    for command, option, library in pairs:
        shown = _default(command, option)
        assert shown == library and type(shown) is type(library), (command.__name__, option)


def test_a_default_written_otherwise_is_found(monkeypatch):
    # the mutation check: a command whose default drifts from the library's fails
    real = inspect.signature

    def drifted(fn):
        sig = real(fn)
        if fn is mix_fit.fit:
            folds = sig.parameters["folds"].replace(default=4)
            return sig.replace(parameters=[folds if p.name == "folds" else p
                                           for p in sig.parameters.values()])  # fmt: skip
        return sig

    monkeypatch.setattr(inspect, "signature", drifted)
    with pytest.raises(AssertionError, match="folds"):
        test_the_commands_show_the_librarys_defaults()
