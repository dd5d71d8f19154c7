"""Continued pretraining (``train.init_from``): the run it starts from, and the scoring
of the model on the new and the initial run's validation sets before and after."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ledgerlm.config import Recipe, recipe_from_dict
from ledgerlm.data.verify import verified as data_verified
from ledgerlm.ledger import events
from ledgerlm.ledger.continued import before_after
from ledgerlm.ledger.store import Ledger, LedgerError
from ledgerlm.tokens.loader import validation_batches
from ledgerlm.tokens.packing import Batch
from ledgerlm.tokens.shards import TokenStore
from ledgerlm.tokens.verify import verified as tokens_verified
from ledgerlm.train.distributed import World
from ledgerlm.train.evaluate import evaluate
from ledgerlm.train.record import Recorder
from ledgerlm.workspace import BuiltVersion, Workspace


@dataclass(frozen=True)
class InitSource:
    """The finished run a continued-pretraining run starts from."""

    run_id: str
    recipe: Recipe
    tokens_version: str
    checkpoint: Path

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for the other ranks (``from_dict``)."""
        return {
            "run_id": self.run_id,
            "recipe": self.recipe.to_dict(),
            "tokens_version": self.tokens_version,
            "checkpoint": str(self.checkpoint),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InitSource:
        recipe = recipe_from_dict(d["recipe"])
        return cls(d["run_id"], recipe, d["tokens_version"], Path(d["checkpoint"]))


def find_version(
    workspace: Workspace, kind: str, version: str | None, verify: bool = True
) -> BuiltVersion:
    """A run's data or tokens version, which must still be in the workspace; checked
    against its manifest (content hashes included) unless ``verify`` is False (a rank
    other than 0, once rank 0 has checked it)."""
    found = version and workspace.reuse(kind, version, time.perf_counter())
    if not found:
        raise FileNotFoundError(f"the run's {kind} version {version} is not in {workspace.root}")
    if not verify:
        return found
    return data_verified(found) if kind == "data" else tokens_verified(found)


def init_source(recipe: Recipe, ledger: Ledger, workspace: Workspace) -> tuple[Recipe, InitSource]:
    """Resolve ``train.init_from`` to a finished run; the recipe it returns names that run
    by id and reuses its tokenizer, so the stored recipe says exactly what was done."""
    run_id = ledger.resolve_run(str(recipe.train.init_from))
    run = ledger.run_summary(run_id)["run"]
    if run["status"] not in ("reached", "not reached"):
        raise LedgerError(f"train.init_from: run {run_id} has not finished ({run['status']})")
    start = recipe_from_dict(run["recipe"])
    if start.model != recipe.model:
        a, b = start.model.model_dump(), recipe.model.model_dump()
        diff = ", ".join(f"model.{k} {a[k]} != {b[k]}" for k in a if a[k] != b[k])
        raise ValueError(f"train.init_from: run {run_id} has another model shape ({diff})")
    tree = recipe.to_dict()
    tree["train"]["init_from"] = run_id
    reuse = tree["tokenizer"]["reuse"]
    if reuse not in (None, run["tokens_version"]):
        raise ValueError(
            f"tokenizer.reuse = {reuse!r}, but run {run_id} was trained with the tokenizer "
            f"of tokens version {run['tokens_version']}"
        )
    tree["tokenizer"]["reuse"] = run["tokens_version"]
    folder = workspace.run_dir(run_id) / "checkpoint"
    return recipe_from_dict(tree), InitSource(run_id, start, run["tokens_version"], folder)


class BeforeAfter:
    """Scores the model on the new and the initial run's validation sets, before and
    after training, each time as an ``eval`` phase of this run."""

    def __init__(self, init: InitSource, workspace: Workspace, recipe: Recipe) -> None:
        self.init, self.recipe = init, recipe
        store = TokenStore(find_version(workspace, "tokens", init.tokens_version).path)
        rows = recipe.train.micro_batch_rows
        self.old_val = validation_batches(store, init.recipe.pack, init.recipe.eval, rows)
        self.old_domains = store.domains
        self.scores: dict[str, dict[str, float]] = {}

    def score(
        self,
        recorder: Recorder,
        when: str,
        model: torch.nn.Module,
        new_val: list[Batch] | None,
        domains: list[str],
        world: World | None = None,
    ) -> None:
        """Score the model (every rank under torchrun: the sums are all-reduced)."""
        bf16 = self.recipe.train.precision == "bf16"
        step = 0 if when == "before" else None
        recorder.start("eval", step, what=f"continued pretraining: {when}")
        device = next(model.parameters()).device.type
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            if new_val is not None:
                attention = self.recipe.pack.attention
                self.scores[f"new_{when}"] = evaluate(model, new_val, attention, domains, world)
            attention = self.init.recipe.pack.attention
            old = evaluate(model, self.old_val, attention, self.old_domains, world)
            self.scores[f"old_{when}"] = old

    def report(self, recorder: Recorder, new_after: dict[str, float]) -> list[dict]:
        sc = self.scores
        rows = before_after(sc["new_before"], new_after, sc["old_before"], sc["old_after"])
        message = json.dumps({"init_from": self.init.run_id, "rows": rows})
        recorder.event(events.CONTINUED_PRETRAINING, message)
        return rows
