"""Command help reads as paragraphs at any terminal width: a docstring's hard line
breaks are joined (list items and \\b paragraphs keep theirs), and what it says is
shown as written, never read as rich markup."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from ledgerlm.cli.main import app
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


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the click tree typer builds, with the words that reach it."""
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        if not command.hidden:
            yield from _commands(command, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _help(path: tuple[str, ...]) -> list[str]:
    """``--help`` of a command at a terminal wide enough that rich wraps nothing, as
    lines with the panels' borders and runs of spaces taken out."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    return [" ".join(line.replace("│", " ").split()) for line in result.output.splitlines()]


def _paragraphs(text: str | None) -> list[str]:
    return inspect.cleandoc(text or "").partition("\f")[0].split("\n\n")


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(path) or "ledgerlm" for path, _ in COMMANDS]
)
def test_help_shows_every_bracket_and_no_sentence_broken(path, command):
    """What a command's help says is on screen as written: brackets ([data],
    ledgerlm[mlflow], [0, 0, 2]) are never read as rich markup, and each paragraph of
    prose (its own, its options', and its subcommands' first lines in its list) is one
    line when the terminal is wide."""
    shown = _help(path)
    screen = " ".join(shown)
    texts = [command.help, *(p.help for p in command.params if getattr(p, "help", None))]
    for text in texts:
        for literal in re.findall(r"\[[^\[\]\n]+\]", text or ""):
            assert " ".join(literal.split()) in screen, f"{literal} missing from {path} --help"
    prose = [p for text in texts for p in _paragraphs(text)]
    prose += [_paragraphs(sub.help)[0] for sub in getattr(command, "commands", {}).values()]
    for paragraph in prose:
        if paragraph.startswith("\b") or re.search(r"^\s*[-*] |\n\s", paragraph, re.M):
            continue  # a paragraph that keeps its line breaks
        line = " ".join(paragraph.split())
        assert any(line in row for row in shown), f"{path}: broken or missing: {line!r}"
