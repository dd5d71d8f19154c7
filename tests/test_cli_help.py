"""Command help reads as paragraphs at any terminal width: a docstring's hard line
breaks are joined (list items and \\b paragraphs keep theirs)."""

from ledgerlm.cli.ui import _reflow


def test_paragraph_lines_are_joined_and_list_items_kept():
    text = _reflow(
        [
            "Reports seconds and FLOPs\nper generated token.",
            "Points:\n- one\n- two\n  continued",
            "\bkept\nas is",
        ]
    )
    assert text == (
        "Reports seconds and FLOPs per generated token.\n\n"
        "Points:\n- one\n- two\n  continued\n\n"
        "\bkept\nas is"
    )
