"""``mix plan`` and ``mix search`` name the flags where the library names its arguments
(``cli.mix_cmd.flags_in_errors``)."""

from __future__ import annotations

import pytest

from ledgerlm.cli.mix_cmd import SEARCH_FLAGS, flags_in_errors


@pytest.mark.parametrize(
    ("library", "console"),
    [
        (
            "proxy may not change [data] or [tokenizer]: the trials must share the data",
            "--proxy may not change [data] or [tokenizer]: the trials must share the data",
        ),
        ("proxy: unknown key 'modle.d_model'", "--proxy: unknown key 'modle.d_model'"),
        (
            "trials 2: a regression needs at least 3 trials",
            "--trials 2: a regression needs at least 3 trials",
        ),
        (
            "m.json: search s was planned from another recipe or settings; run it with the "
            "same recipe and flags, or give this one another search_id",
            "m.json: search s was planned from another recipe or settings; run it with the "
            "same recipe and flags, or give this one another --name",
        ),
    ],
)
def test_a_library_error_naming_an_argument_names_its_flag(library, console):
    with pytest.raises(ValueError) as info, flags_in_errors(SEARCH_FLAGS):
        raise ValueError(library)
    assert str(info.value) == console


@pytest.mark.parametrize(
    "message",
    [
        "/tmp/search_id/mixtures/search_id.json: not a search record",  # a path holding it
        "the proxy trials must share the data",  # the word, not leading
        "trialsome: not an argument",
    ],
)
def test_other_errors_pass_unchanged(message):
    error = ValueError(message)
    with pytest.raises(ValueError) as info, flags_in_errors(SEARCH_FLAGS):
        raise error
    assert info.value is error


def test_the_proxy_errors_of_a_search_show_the_proxy_flag():
    from ledgerlm.config import recipe_from_dict
    from ledgerlm.lab.mix_search import proxy_recipe

    base = recipe_from_dict({})
    for proxy, library in [
        (["data.exact_dedup=false"], "proxy may not change [data] or [tokenizer]: "),
        (["model.d_model=0"], "proxy: model.d_model: "),
    ]:
        with pytest.raises(ValueError) as info:
            proxy_recipe(base, proxy)
        assert str(info.value).startswith(library)  # the library names its argument
        with pytest.raises(ValueError) as info, flags_in_errors(SEARCH_FLAGS):
            proxy_recipe(base, proxy)
        assert str(info.value).startswith(f"--{library}")  # the console the flag
