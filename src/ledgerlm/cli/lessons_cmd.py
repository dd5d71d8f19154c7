"""``ledgerlm lessons``: the teaching checks of requirements E (docs/requirements.md), each
computed with the project's own functions against the worked numbers, with a verdict."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.markup import escape

from ledgerlm.cli.ui import JsonOpt, console, friendly_errors
from ledgerlm.lessons.registry import LESSONS  # the registry only: no numpy or torch yet


@friendly_errors
def lessons(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="NAME",
            help=f"Lessons to run ({', '.join(LESSONS)}); all when none is named.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    from ledgerlm.lessons.registry import run_lessons

    start = time.perf_counter()
    results = run_lessons(names)
    seconds = time.perf_counter() - start
    passed = sum(r.passed for r in results)
    if as_json:
        out = {
            "passed": passed == len(results),
            "seconds": round(seconds, 3),
            "lessons": [r.to_dict() for r in results],
        }
        console.print_json(json.dumps(out))
    else:
        for r in results:
            verdict = "[bold green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
            console.print(
                f"{verdict} [bold]{escape(r.name)}[/]: {escape(r.title)} ({escape(r.source)})",
                highlight=False,
                soft_wrap=True,
            )
            for line in r.lines:
                style = "red" if line.startswith("FAIL") else ""
                console.print(f"  {escape(line)}", style=style, highlight=False, soft_wrap=True)
            console.print()
        colour = "green" if passed == len(results) else "red"
        console.print(
            f"[{colour}]{passed} of {len(results)} lessons passed[/] in {seconds:.1f} s",
            highlight=False,
        )
    if passed != len(results):
        raise typer.Exit(1)


# One line per lesson: a paragraph opening with \b keeps its line breaks in --help.
lessons.__doc__ = "\n\n".join(
    [
        "Run the teaching checks (requirements E): small CPU computations through the "
        "project's own functions, compared with the worked numbers of docs/requirements.md; "
        "exit code 1 when one fails.",
        "\b\n" + "\n".join(f"{name}: {lesson.summary}" for name, lesson in LESSONS.items()),
    ]
)
