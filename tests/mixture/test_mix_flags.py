"""``mix plan`` and ``mix search`` name the flags where the library names its arguments
(an ``ArgumentError``, worded by ``friendly_errors(flags=...)``)."""

from __future__ import annotations

import pytest

from ledgerlm.cli.mix_cmd import SEARCH_FLAGS
from ledgerlm.cli.ui import error_line


def test_the_proxy_errors_of_a_search_show_the_proxy_flag():
    from ledgerlm.config import recipe_from_dict
    from ledgerlm.lab.mix_search.proxy import proxy_recipe

    base = recipe_from_dict({})
    for proxy, library in [
        (["data.exact_dedup=false"], "proxy may not change [data] or [tokenizer]: "),
        (["model.d_model=0"], "proxy: model.d_model: "),
    ]:
        with pytest.raises(ValueError) as info:
            proxy_recipe(base, proxy)
        assert str(info.value).startswith(library)  # the library names its argument
        assert error_line(info.value, SEARCH_FLAGS).startswith(f"--{library}")  # the console


def test_a_search_planned_otherwise_names_the_name_flag(tmp_path):
    from ledgerlm.lab.mix_search.record import start_record
    from ledgerlm.workspace import Workspace

    ws = Workspace(tmp_path)
    start_record(ws, "mixes", {"trials": 3})
    with pytest.raises(ValueError) as info:
        start_record(ws, "mixes", {"trials": 4})
    assert str(info.value).endswith("give this one another search_id")
    line = error_line(info.value, SEARCH_FLAGS)
    assert line == (
        f"{ws.search_file('mixes')}: search mixes was planned from another recipe or "
        "settings; run it with the same recipe and flags, or give this one another --name"
    )


def test_a_search_takes_the_regressions_models_from_the_library(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from ledgerlm.cli.main import app
    from ledgerlm.mixture import regress

    def search_with(model: str) -> str:
        args = ["mix", "search", str(tmp_path / "absent.toml"), "--model", model]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        return " ".join(result.stderr.split())

    # refused before the recipe is read, naming the models the regression fits
    assert search_with("forest") == "error: --model 'forest': use auto, lightgbm or linear"
    monkeypatch.setattr(regress, "MODELS", (*regress.MODELS, "forest"))
    assert search_with("forest").startswith(f"error: {tmp_path / 'absent.toml'}")
    assert search_with("tree") == "error: --model 'tree': use auto, lightgbm, linear or forest"
