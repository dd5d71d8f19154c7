"""Export a run of the ledger as a Hugging Face ``LlamaForCausalLM`` folder: the run's
stored recipe and checkpoint rebuild the model, ``model.export.export_hf`` writes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgerlm.config import Recipe, load_recipe
from ledgerlm.extras import check
from ledgerlm.ledger.store import Ledger, require_ledger
from ledgerlm.model.export import ExportError, check_target, export_hf
from ledgerlm.model.gpt import GPT
from ledgerlm.train.checkpoint import STATE, load_checkpoint, resolve_checkpoint
from ledgerlm.workspace import Workspace, read_json


@dataclass
class RunModel:
    """A run's model rebuilt from its stored recipe and checkpoint."""

    run_id: str
    model: GPT
    recipe: Recipe
    tokens_version: str
    tokenizer: dict[str, Any]  # the tokens manifest's tokenizer entry


def load_run_model(
    workspace: Workspace,
    run_ref: str,
    *,
    purpose: str = "export",
    before_load: Callable[[], None] | None = None,
) -> RunModel:
    """The model of run ``run_ref`` (id, unique part or ``latest``) with its weights.

    Raises ``ExportError`` (one line) when there is no ledger, the run has no
    checkpoint ("no checkpoint to <purpose>"), or its recipe does not match the
    checkpoint. ``before_load`` runs once the run is known to have a checkpoint and
    before the (slower) model load: a check of the caller's own."""
    require_ledger(workspace.ledger_path, error=ExportError)
    with Ledger(workspace.ledger_path) as ledger:
        run_id = ledger.resolve_run(run_ref)
        tokens_version = ledger.run_summary(run_id)["run"]["tokens_version"]
    run_dir = workspace.run_dir(run_id)
    # a save killed between its renames leaves the checkpoint before it, as resume reads it
    checkpoint = resolve_checkpoint(run_dir / "checkpoint")
    if tokens_version is None or not (checkpoint / STATE).is_file():
        raise ExportError(f"run {run_id} has no checkpoint to {purpose}")
    if before_load is not None:
        before_load()
    recipe = load_recipe(run_dir / "recipe.toml")
    tok = workspace.manifest("tokens", tokens_version)["tokenizer"]
    model = GPT(recipe.model, int(tok["vocab_size"]))
    recorded = read_json(checkpoint / STATE).get("recipe_sha256")
    if recorded is not None and recorded != recipe.digest():
        raise ExportError(f"{run_dir / 'recipe.toml'} does not match the run's checkpoint")
    load_checkpoint(checkpoint, model)
    return RunModel(run_id, model, recipe, tokens_version, tok)


def export_run(workspace: Workspace, run_ref: str, out_dir: Path, *, force: bool = False) -> Path:
    """Rebuild a run's model from its stored recipe and checkpoint, then ``export_hf`` it."""
    check("transformers", "ledgerlm export hf")  # before the run is read or anything written
    loaded = load_run_model(
        workspace, run_ref, before_load=lambda: check_target(Path(out_dir), force)
    )
    return export_hf(
        loaded.model.eval(),
        out_dir,
        tokenizer_path=workspace.version_dir("tokens", loaded.tokens_version) / "tokenizer.json",
        special=loaded.tokenizer["special"],
        max_positions=loaded.recipe.pack.seq_len,
        force=force,
    )
