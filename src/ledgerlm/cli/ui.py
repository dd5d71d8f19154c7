"""Terminal helpers shared by the commands: progress bars, errors, tables, help text."""

from __future__ import annotations

import functools
import inspect
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ledgerlm.errors import ArgumentError
from ledgerlm.lab.signals import (
    exit_status,
    received,
    signal_name,
    signals_as_interrupts,
    undisturbed,
)
from ledgerlm.ledger.store import LedgerError
from ledgerlm.workspace import DEFAULT_WORKSPACE


def _reflow(paragraphs: list[str], markup_mode: Any = None) -> str:
    """A command's help paragraphs with their hard line breaks joined, so rich wraps them
    to the terminal (recent typer keeps the docstring's breaks, and a narrow terminal
    then wraps each line again, raggedly). A line that starts a list item, and a
    paragraph marked with \\b, keep their breaks."""
    out = []
    for paragraph in paragraphs:
        if paragraph.startswith("\b"):
            out.append(paragraph)
            continue
        lines: list[str] = []
        for line in paragraph.split("\n"):
            item = line.lstrip().startswith(("- ", "* ")) or line[:1].isspace()
            if lines and not item:
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _literal_help(*, text: str, style: str = "", markup_mode: Any = "rich") -> Any:
    """Help text as typer's rich mode styles it, but never read as markup: a recipe's
    ``[data]`` section or ``ledgerlm[mlflow]`` stays on screen. A paragraph's \\b marker
    is dropped (its line breaks are kept by ``_reflow``)."""
    import typer.rich_utils as rich_utils

    if markup_mode != "rich":
        return _TYPER_RICH_TEXT(text=text, style=style, markup_mode=markup_mode)
    text = inspect.cleandoc(text).replace("\b\n", "").replace("\b", "")
    return rich_utils.highlighter(Text(text, style=style))


def _command_help(*, help_text: str, markup_mode: Any) -> Any:
    """A command's line in its group's list, its first paragraph reflowed like the
    command's own help (typer's rich mode keeps the docstring's line breaks there)."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return _TYPER_COMMAND_HELP(help_text=_reflow(paragraphs), markup_mode=markup_mode)


def _plain_help() -> None:
    """Every help text literal and reflowed: typer's rich rendering, patched where it
    reads markup and where it keeps hard line breaks (each patch only when this typer
    has the function)."""
    import typer.rich_utils as rich_utils

    global _TYPER_RICH_TEXT, _TYPER_COMMAND_HELP
    if hasattr(rich_utils, "_fix_linebreaks"):
        rich_utils._fix_linebreaks = _reflow
    if _TYPER_RICH_TEXT is None and hasattr(rich_utils, "_make_rich_text"):
        _TYPER_RICH_TEXT = rich_utils._make_rich_text
        rich_utils._make_rich_text = _literal_help
    if _TYPER_COMMAND_HELP is None and hasattr(rich_utils, "_make_command_help"):
        _TYPER_COMMAND_HELP = rich_utils._make_command_help
        rich_utils._make_command_help = _command_help


_TYPER_RICH_TEXT: Any = None
_TYPER_COMMAND_HELP: Any = None
_plain_help()

console = Console()
err_console = Console(stderr=True)

WorkspaceOpt = Annotated[
    Path,
    typer.Option(
        "--workspace",
        "-w",
        envvar="LEDGERLM_WORKSPACE",
        help="Workspace folder (data and token versions, runs, ledger.db).",
    ),
]
DEFAULT_WS = DEFAULT_WORKSPACE
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a recipe value: section.key=value (repeatable)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
NoVerifyOpt = Annotated[
    bool,
    typer.Option(
        "--no-verify",
        help="Reuse existing versions without hashing their content (file sizes, counts "
        "and token ids are still checked).",
    ),
]

# Faults a user can cause or meet (bad input, a full disk, a read-only folder, a diverged
# loss) end in one line; LEDGERLM_TRACEBACK=1 shows the traceback instead.
USER_ERRORS = (
    LedgerError,
    OSError,
    ValueError,  # config.RecipeError and data.pipeline.DataError among them
    sqlite3.Error,
    FloatingPointError,  # train.loop.NonFiniteLossError: a loss that diverged
)


def load_recipe(path: Path, overrides: list[str] | None = None) -> Any:
    """``ledgerlm.config.load_recipe``, imported when a command loads a recipe: building
    the recipe models is most of what the CLI would otherwise spend starting up."""
    from ledgerlm.config import load_recipe as load

    return load(path, overrides)


def error_line(exc: BaseException, flags: Mapping[str, str] | None = None) -> str:
    """One line for an expected error: an OSError as ``path: cause``; an
    ``ArgumentError`` naming each argument by its flag in ``flags``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    if isinstance(exc, ArgumentError):
        text = exc.worded(flags or {})
    else:
        text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())  # one line, whatever the message held


def _print_error(line: str) -> None:
    """The error line; a signal arriving meanwhile does not cut it short, and a terminal
    that hung up (SIGHUP) takes none."""
    with undisturbed(), suppress(OSError):
        err_console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


def friendly_errors(
    fn: Callable[..., Any] | None = None, *, flags: Mapping[str, str] | None = None
) -> Any:
    """Turn expected errors into one clear line on stderr and exit code 2; SIGTERM and
    SIGHUP end the command as Ctrl-C does (``lab/signals.py``): ``error: interrupted by
    SIGTERM`` and the exit status a shell gives that signal (143; 130 for Ctrl-C).

    ``@friendly_errors(flags={"holdout": "--holdout"})``: a library's ``ArgumentError``
    names those arguments by the command's flags."""
    if fn is None:
        return functools.partial(friendly_errors, flags=flags)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with signals_as_interrupts():
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, SystemExit):
                raise
            except BaseException as exc:
                # a signal ends the command, whatever error it caused on the way out
                stop = exc if isinstance(exc, KeyboardInterrupt) else received()
                if stop is not None:
                    _print_error(f"interrupted by {signal_name(stop)}")
                    raise typer.Exit(exit_status(stop)) from None
                if not isinstance(exc, USER_ERRORS) or os.environ.get("LEDGERLM_TRACEBACK"):
                    raise
                _print_error(error_line(exc, flags))
                raise typer.Exit(2) from None

    return wrapper


class _RichTask:
    def __init__(self, progress: Progress, task_id: Any) -> None:
        self.progress, self.task_id = progress, task_id

    def advance(self, n: float = 1, **fields: Any) -> None:
        if isinstance(fields.get("info"), str):  # shown as markup: may name a domain or a run
            fields["info"] = escape(fields["info"])
        self.progress.update(self.task_id, advance=n, **fields)


PROGRESS_SECONDS = "LEDGERLM_PROGRESS_SECONDS"  # between plain progress lines; 0: none


class _PlainTask:
    """A task reported as plain lines on stdout: one every ``every`` seconds and one at
    the end, each with the count, the share done, the elapsed time, an ETA and the
    task's info (for a training run: loss, learning rate, tokens per second)."""

    def __init__(self, description: str, total: float | None, every: float) -> None:
        self.description, self.total, self.every = description, total, every
        self.done, self.info = 0.0, ""
        self.start = self.last = time.monotonic()

    def advance(self, n: float = 1, **fields: Any) -> None:
        self.done += n
        if isinstance(fields.get("info"), str):
            self.info = fields["info"]
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.line(now)

    def line(self, now: float, final: bool = False) -> None:
        elapsed = now - self.start
        count = f"{self.done:,.0f}" + (f"/{self.total:,.0f}" if self.total else "")
        parts = [f"[{elapsed:7.1f} s] {self.description} {count}"]
        if self.total and not final:
            parts.append(f"({self.done / self.total:.0%})")
            if self.done:
                eta = (self.total - self.done) * elapsed / self.done
                parts.append(f"ETA {eta:,.0f} s")
        if final:
            parts.append("done")
        if self.info:
            parts.append(self.info)
        print(" ".join(parts), flush=True)


class _Both:
    def __init__(self, *tasks: Any) -> None:
        self.tasks = tasks

    def advance(self, n: float = 1, **fields: Any) -> None:
        for task in self.tasks:
            task.advance(n, **dict(fields))


class RichProgress:
    """Library ``Progress`` backed by rich bars on stderr when it is a terminal, and by
    plain periodic lines on stdout when stdout is not one (output sent to a file or a
    pipe shows progress as it happens). ``lines=False`` keeps stdout clean (``--json``)."""

    def __init__(self, lines: bool = True) -> None:
        every = float(os.environ.get(PROGRESS_SECONDS, "10") or 0)
        self._every = every if lines and every > 0 and not sys.stdout.isatty() else None
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=err_console,
            transient=False,
            disable=not sys.stderr.isatty(),
        )

    def __enter__(self) -> RichProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def note(self, line: str) -> None:
        """One line on stderr, above the bars; escaped, since it may hold a path or a
        library's message."""
        self._progress.console.print(escape(line), highlight=False, soft_wrap=True)

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Any]:
        task_id = self._progress.add_task(escape(description), total=total, info="")
        rich = _RichTask(self._progress, task_id)
        if self._every is None:
            yield rich
        else:
            plain = _PlainTask(description, total, self._every)
            yield _Both(rich, plain)
            plain.line(time.monotonic(), final=True)
        if total is None:  # an open-ended task ends as a full bar
            done = next(t.completed for t in self._progress.tasks if t.id == task_id)
            self._progress.update(task_id, total=done or 1, completed=done or 1)


def fmt_seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:,.1f} s"


def fmt_g(x: float) -> str:
    """3 significant digits, exponents without padding: 2e5, 1.2e11."""
    text = f"{x:.3g}"
    mantissa, e, exp = text.partition("e")
    return f"{mantissa}e{int(exp)}" if e else text
