"""Names that could leave the workspace, nest folders or hide them are refused with one
line naming the file and key, before anything is written; the workspace refuses every
run or version id that is not a plain folder name inside it.

The command-line cases marked ``console`` run the installed console script (a new
process, ~2 s each); the others run the same typer app in this process."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from cli_runner import TINY, ledgerlm
from ledgerlm.config import Recipe, RecipeError, load_recipe
from ledgerlm.ledger.store import Ledger
from ledgerlm.workspace import Workspace

HOSTILE = {
    "parent": "../../evil",
    "nested": "a/b",
    "absolute": "/abs",
    "hidden": ".hidden",
    "dotdot": "..",
    "dot": ".",
    "empty": "",
    "backslash": "a\\b",
    "newline": "a\nb",
    "nul": "a\x00b",
    "long": "a" * 300,
    "markup": "[/bold]",
    "space": "my run",
    "dash-first": "-rf",
    "non-ascii": "caf\u00e9",
    "tilde": "~",
}
FINE = ["tiny", "my-run_2.v1", "_x", "A1", "a" * 100]


def _recipe(tmp_path, name: str | None, stem: str = "recipe"):
    """The tiny recipe with ``name`` (a TOML basic string; None: no name at all)."""
    body = "\n".join(
        line for line in TINY.read_text().splitlines() if not line.startswith("name =")
    )
    head = "" if name is None else f"name = {json.dumps(name)}\n"
    path = tmp_path / f"{stem}.toml"
    path.write_text(head + body + "\n")
    return path


def _cli(*args: str, console: bool = False):
    """``ledgerlm ARGS``: the console script, or the same app in this process."""
    if console:
        return ledgerlm(*args, check=False)
    from ledgerlm.cli.main import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # what would have been a traceback
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def _one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr
    return proc.stderr


@pytest.mark.parametrize("name", HOSTILE.values(), ids=HOSTILE.keys())
def test_load_recipe_refuses_the_name_in_one_line(tmp_path, name):
    path = _recipe(tmp_path, name)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert message.startswith(f"{path}: name: ") and "\n" not in message
    assert "\x00" not in message and len(message) < 300
    with pytest.raises(RecipeError):  # and the same through --set
        load_recipe(_recipe(tmp_path, "fine"), [f"name={json.dumps(name)}"])


@pytest.mark.parametrize("name", FINE)
def test_plain_names_still_work(tmp_path, name):
    assert load_recipe(_recipe(tmp_path, name)).name == name
    assert load_recipe(TINY, [f"name={name}"]).name == name


def test_the_file_name_is_the_default_only_when_it_is_a_name(tmp_path):
    assert load_recipe(_recipe(tmp_path, None, stem="tiny-2.v1")).name == "tiny-2.v1"
    path = _recipe(tmp_path, None, stem="my recipe")
    with pytest.raises(RecipeError, match=r"set name = \"\.\.\.\" in the recipe") as err:
        load_recipe(path)
    assert str(err.value).startswith(f"{path}: name: ")
    assert load_recipe(path, ["name=mine"]).name == "mine"  # --set names it


def test_a_recipe_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match=r"starts with '\.'"):
        Recipe(name="../x")


@pytest.mark.parametrize(
    ("name", "console"),
    [("../../evil", True), (".hidden", False), ("a\nb", False), ("a\x00b", False)],
)
def test_run_refuses_a_hostile_name_before_the_workspace_exists(tmp_path, name, console):
    ws = tmp_path / "ws"
    proc = _cli("run", str(_recipe(tmp_path, name)), "-w", str(ws), console=console)
    _one_line_error(proc, "recipe.toml: name: ")
    assert not ws.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.toml"]


@pytest.mark.parametrize(("name", "console"), [("a/b", True), ("[/bold]", False), ("/abs", False)])
def test_run_refuses_a_hostile_set_name(tmp_path, name, console):
    ws = tmp_path / "ws"
    proc = _cli("run", str(TINY), "-w", str(ws), "--set", f"name={name}", console=console)
    _one_line_error(proc, "(with --set): name: ", repr(name))
    assert not ws.exists()


def test_run_refuses_an_unnamed_recipe_whose_file_name_is_no_name(tmp_path):
    ws = tmp_path / "ws"
    path = _recipe(tmp_path, None, stem="my recipe")
    _one_line_error(_cli("run", str(path), "-w", str(ws)), "set name = ")
    assert not ws.exists()


# -- the workspace -------------------------------------------------------------------

IDS = [v for k, v in HOSTILE.items() if k not in ("markup", "space", "dash-first", "long")]
IDS += ["x" * 256, "a b", "x/../../y"]


@pytest.mark.parametrize("bad", IDS)
def test_workspace_refuses_ids_that_are_no_folder_name(tmp_path, bad):
    ws = Workspace(tmp_path / "ws")
    for call in (
        lambda: ws.run_dir(bad),
        lambda: ws.version_dir("data", bad),
        lambda: ws.version_dir("tokens", bad),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert "\n" not in str(err.value)
    assert not (tmp_path / "ws").exists()


def test_workspace_ids_that_are_folder_names(tmp_path):
    ws = Workspace(tmp_path / "ws")
    assert ws.run_dir("tiny-20250101-120000-ab12") == tmp_path / "ws/runs/tiny-20250101-120000-ab12"
    assert ws.version_dir("data", "0123abcd") == tmp_path / "ws/data/0123abcd"
    assert ws.run_dir("a..b") == tmp_path / "ws/runs/a..b"  # dots inside are plain text


def test_workspace_refuses_an_id_that_a_symlink_leads_out(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws/runs").mkdir(parents=True)
    os.symlink(outside, tmp_path / "ws/runs/planted")
    with pytest.raises(ValueError, match="outside the workspace"):
        Workspace(tmp_path / "ws").run_dir("planted")


def test_workspace_folders_may_be_symlinks_to_another_disk(tmp_path):
    """``runs/`` or ``data/`` on a bigger disk is a user's choice, not an escape."""
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "ws").mkdir()
    os.symlink(disk, tmp_path / "ws/data")
    assert Workspace(tmp_path / "ws").version_dir("data", "v1") == tmp_path / "ws/data/v1"


# -- run references typed on the command line ----------------------------------------


def _ledger_with(tmp_path, name: str) -> str:
    with Ledger(tmp_path / "ledger.db") as ledger:
        return ledger.create_run(name, {}, target_metric="loss", target_value=1.0, eval_every=1)


@pytest.mark.parametrize(
    ("args", "console"),
    [
        (("resume", "../x"), True),
        (("export", "hf", "../../x", "OUT"), False),
        (("ledger", "show", "../x"), False),
        (("ledger", "export-mllog", "/abs"), False),
        (("report", "../x", "-o", "OUT/r.html"), False),
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, tuple) else str(a),
)
def test_an_unknown_run_reference_is_one_line(tmp_path, args, console):
    _ledger_with(tmp_path, "tiny")
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    proc = _cli(*args, "-w", str(tmp_path), console=console)
    _one_line_error(proc, "no run matches")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "console"),
    [
        (("export", "hf", "../", "OUT"), True),
        (("resume", "../"), False),
        (("ledger", "export-mllog", ".."), False),
    ],
    ids=lambda a: " ".join(a[:2]) if isinstance(a, tuple) else str(a),
)
def test_a_hostile_run_id_from_an_old_ledger_leads_nowhere(tmp_path, args, console):
    """A ledger written before names were checked may hold a run named ``../../evil``:
    its id is refused as a folder name, before anything is written anywhere."""
    ws = tmp_path / "a" / "b" / "ws"
    ws.mkdir(parents=True)
    _ledger_with(ws, "../../evil")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    proc = _cli(*args, "-w", str(ws), console=console)
    _one_line_error(proc, "is not a valid id")
    assert sorted(p.name for p in ws.iterdir()) == ["ledger.db"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


# -- sweeps ---------------------------------------------------------------------------


def test_sweep_ids_and_their_runs_stay_names(tmp_path):
    from ledgerlm.lab.sweep import run_sweep
    from ledgerlm.scaling.sweep import SweepError, plan, sweep_id

    base = load_recipe(TINY)
    points = plan(base, [2e5], [1e5])
    ws = Workspace(tmp_path / "ws")
    assert Recipe(name=sweep_id(base, points)).name.startswith("tiny-sweep-")
    for bad in ("../x-sweep-abcdef", "a/b-sweep-abcdef", ".x-sweep-abcdef"):
        with pytest.raises(SweepError, match="expected a name of"):
            run_sweep(base, points, ws, sweep_id=bad)
    long = load_recipe(TINY, [f"name={'a' * 100}"])
    with pytest.raises(SweepError, match="shorten the recipe's name"):
        run_sweep(long, points, ws)
    assert not (tmp_path / "ws").exists()
