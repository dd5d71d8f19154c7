"""Every package the library imports is a runtime dependency or an extra that names it.

The dev extras install everything, so the test suite alone cannot see a runtime
dependency that is missing; this reads the imports of ``src/ledgerlm`` and the
dependency lists of ``pyproject.toml`` instead (``.ci/runtime_only.sh`` proves the
same on a real install).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from ledgerlm.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "ledgerlm"


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _installed_with(names: set[str]) -> set[str]:
    """``names`` and what they require (unconditionally), transitively: a module that a
    runtime dependency always brings (pydantic brings pydantic-core) is there too."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except PackageNotFoundError:
            continue
        todo += [_name(r) for r in reqs if "extra ==" not in r]
    return seen


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level module -> the files importing it, for modules outside the standard library."""
    found: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "ledgerlm" and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_a_runtime_dependency_or_a_named_extra():
    project = _project()
    runtime = _installed_with({_name(r) for r in project["dependencies"]})
    extras = project["optional-dependencies"]
    owners = packages_distributions()
    unlisted = []
    for module, files in sorted(_third_party_imports().items()):
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if dists & runtime:
            continue
        if module in EXTRAS:
            package, extra = EXTRAS[module]
            assert extra in extras, f"{module}: extra {extra!r} is not in pyproject.toml"
            assert package in {_name(r) for r in extras[extra]}, (module, extras[extra])
            continue
        unlisted.append(f"{module} (imported by {', '.join(sorted(set(files)))})")
    assert not unlisted, "imported but neither a runtime dependency nor an extra: " + "; ".join(
        unlisted
    )


def test_the_dev_extra_holds_every_other_extra():
    """``make test`` installs dev only: every optional feature is then tested."""
    extras = _project()["optional-dependencies"]
    dev = {_name(r) for r in extras["dev"]}
    for extra, requirements in extras.items():
        assert {_name(r) for r in requirements} <= dev | {"ledgerlm"}, extra


def test_a_missing_extra_is_one_line_naming_it(tmp_path):
    """``require`` under a blocked import: the extra's install line, no traceback."""
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from ledgerlm.extras import check, require, MissingExtraError\n"
        "for f in (check, require):\n"
        "    try: f('transformers', 'the export')\n"
        "    except MissingExtraError as e: print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = "the export needs the transformers package: pip install 'ledgerlm[hf]'"
    assert out.stdout.splitlines() == [expected, expected]
