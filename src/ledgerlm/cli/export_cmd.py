"""``ledgerlm export``: hand a trained run to other tools."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ledgerlm.cli.ui import DEFAULT_WS, WorkspaceOpt, console, friendly_errors
from ledgerlm.workspace import Workspace

app = typer.Typer(help="Export a run's trained model to other formats.", no_args_is_help=True)


@app.command("hf")
@friendly_errors
def hf(
    run: Annotated[str, typer.Argument(help="Run: its id, a unique part, or 'latest'.")],
    out_dir: Annotated[Path, typer.Argument(metavar="DIR", help="Folder to write.")],
    workspace: WorkspaceOpt = DEFAULT_WS,
    force: Annotated[
        bool, typer.Option("--force", help="Replace DIR even if it is not empty.")
    ] = False,
) -> None:
    """Write a Hugging Face LlamaForCausalLM folder (config, safetensors, tokenizer)."""
    from ledgerlm.lab.export import export_run

    out = export_run(Workspace(workspace), run, out_dir, force=force)
    console.print(f"exported to {escape(str(out))} (load with transformers.AutoModelForCausalLM)")
