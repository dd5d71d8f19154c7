"""``ledgerlm data``: build and inspect data versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ledgerlm.cli.ui import (
    DEFAULT_WS,
    JsonOpt,
    RichProgress,
    SetOpt,
    WorkspaceOpt,
    console,
    friendly_errors,
)
from ledgerlm.config import load_recipe
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.workspace import Workspace

app = typer.Typer(help="Build and inspect data versions.", no_args_is_help=True)


@app.command("prepare")
@friendly_errors
def prepare(
    recipe: Annotated[Path, typer.Argument(help="Recipe TOML file (its [data] section).")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    set_: SetOpt = None,
) -> None:
    """Read, deduplicate and split documents into a content-addressed data version."""
    cfg = load_recipe(recipe, set_).data
    with RichProgress() as progress:
        result = prepare_data(cfg, Workspace(workspace), progress)
    c = result.manifest["counts"]
    state = "reused" if result.reused else f"built in {result.seconds:.1f} s"
    console.print(
        f"data version {result.version} ({state}): {c['records_in']:,} read, "
        f"{c['kept']:,} kept -> {result.path}"
    )


@app.command("inspect")
@friendly_errors
def inspect(
    version: Annotated[str, typer.Argument(help="Data version id or a unique prefix.")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    as_json: JsonOpt = False,
) -> None:
    """Show a data version's manifest: inputs, steps, counts, files."""
    ws = Workspace(workspace)
    manifest = ws.manifest("data", ws.resolve_version("data", version))
    if as_json:
        console.print_json(json.dumps(manifest))
        return
    c = manifest["counts"]
    dropped = sum(d["documents"] for d in c["dropped"])
    console.print(f"data version {manifest['version']}")
    for i in manifest["inputs"]:
        console.print(f"  input {i['source']} (fingerprint {i['fingerprint'][:16]})")
    console.print(
        f"  records in {c['records_in']:,} = kept {c['kept']:,} + dropped {dropped:,}"
        f" + quarantined {c['quarantined']:,}"
    )
    for d in c["dropped"]:
        console.print(f"    dropped by {d['step']} ({d['reason']}): {d['documents']:,}")
    for row in c["by_split_domain"]:
        console.print(
            f"  {row['split']:>5} {row['domain']:<6} {row['documents']:>7,} docs "
            f"{row['chars']:>12,} chars"
        )
