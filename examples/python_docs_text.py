"""Write ~1 MB of plain English text from files every Python install has: the
language reference topics of ``pydoc_data`` and the docstrings of the top-level
standard-library modules, paragraphs separated by blank lines.

    python examples/python_docs_text.py python-docs.txt [--chars 1000000]
"""

from __future__ import annotations

import argparse
import ast
import sysconfig
from pathlib import Path
from pydoc_data.topics import topics


def docstrings(folder: Path):
    for path in sorted(folder.glob("*.py")):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            documented = isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
            if documented and (text := ast.get_docstring(node)):
                yield text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--chars", type=int, default=1_000_000)
    args = parser.parse_args()
    parts = [topics[key] for key in sorted(topics)]
    parts += docstrings(Path(sysconfig.get_paths()["stdlib"]))
    text = "\n\n".join(parts)[: args.chars]
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(text):,} characters, {text.count(chr(10) * 2):,} blank lines")


if __name__ == "__main__":
    main()
