"""One run of a recipe: data -> tokens -> train -> checkpoint, every phase in the ledger.

The run is created in the ledger before any work, so the preparation time of
this run is part of its bill. A reused data or token version costs only the
time to find it; the manifest keeps what building it originally cost.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

from ledgerlm.config import Recipe, recipe_to_toml
from ledgerlm.data.pipeline import prepare_data
from ledgerlm.ledger.clock import PhaseClock
from ledgerlm.ledger.store import Ledger
from ledgerlm.model.gpt import GPT
from ledgerlm.progress import NullProgress, Progress
from ledgerlm.tokens.loader import train_batches, validation_batches
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.train.callbacks import ProgressCallback, StepLog
from ledgerlm.train.checkpoint import save_checkpoint
from ledgerlm.train.evaluate import EvalCallback, unigram_entropy
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer
from ledgerlm.workspace import BuiltVersion, Workspace, atomic_write_text


@dataclass
class RunResult:
    run_id: str
    data: BuiltVersion
    tokens: BuiltVersion
    summary: dict[str, Any]  # read back from the ledger
    unigram_entropy: float
    params: int


def run_recipe(recipe: Recipe, workspace: Workspace, progress: Progress | None = None) -> RunResult:
    progress = progress or NullProgress()
    ledger = Ledger(workspace.ledger_path)
    run_id = ledger.create_run(
        recipe.name,
        recipe.to_dict(),
        target_metric="loss",
        target_value=recipe.eval.target_loss,
        eval_every=recipe.eval.every_steps,
    )
    clock = PhaseClock(ledger, run_id)
    try:
        atomic_write_text(workspace.run_dir(run_id) / "recipe.toml", recipe_to_toml(recipe))
        with ledger.phase(run_id, "prep") as ph:
            data = prepare_data(recipe.data, workspace, progress)
            ph.detail.update(
                version=data.version,
                reused=data.reused,
                built_seconds=data.build_seconds,
            )
        with ledger.phase(run_id, "tokenize") as ph:
            tokens = build_tokens(data, recipe.tokenizer, workspace, progress)
            ph.detail.update(
                version=tokens.version,
                reused=tokens.reused,
                built_seconds=tokens.build_seconds,
            )
        ledger.set_versions(run_id, data_version=data.version, tokens_version=tokens.version)

        torch.manual_seed(recipe.train.seed)
        torch.set_num_threads(recipe.train.threads or os.cpu_count() or 1)
        store = TokenStore(tokens.path)
        with ledger.phase(run_id, "eval", what="build validation set"):
            val = validation_batches(store, recipe.pack, recipe.eval, recipe.train.micro_batch_rows)
            entropy = unigram_entropy(val)
        contract = {
            "metric": "loss",
            "unit": "nat/token",
            "threshold": recipe.eval.target_loss,
            "val_targets": sum(b.num_targets for b in val),
            "val_unigram_entropy": entropy,
            "every_steps": recipe.eval.every_steps,
        }
        ledger.add_event(run_id, "target_contract", json.dumps(contract))

        model = GPT(recipe.model, store.vocab_size)
        optimizer = build_optimizer(model, recipe.train)
        evaluator = EvalCallback(val, recipe.eval, recipe.pack.attention, store.domains)
        with progress.task("train", total=recipe.train.max_steps) as task:
            trainer = Trainer(
                model,
                optimizer,
                recipe.train,
                train_batches(store, recipe.pack, recipe.train.micro_batch_rows, recipe.train.seed),
                recipe.pack.attention,
                callbacks=[StepLog(recipe.eval.every_steps), evaluator, ProgressCallback(task)],
                clock=clock,
            )
            state = trainer.fit()
        ledger.set_counters(run_id, state.counters())
        ledger.add_event(run_id, "train_end", state.stop_reason, step=state.step)

        with ledger.phase(run_id, "checkpoint", step_start=state.step):
            save_checkpoint(
                workspace.run_dir(run_id) / "checkpoint",
                model,
                {
                    "run_id": run_id,
                    "step": state.step,
                    "counters": state.counters(),
                    "recipe_sha256": recipe.digest(),
                },
            )
        ledger.finish_run(
            run_id, "reached" if evaluator.reached_step is not None else "not reached"
        )
        summary = ledger.run_summary(run_id)
    except BaseException as exc:
        clock.stop()
        ledger.add_event(run_id, "error", f"{type(exc).__name__}: {exc}")
        ledger.finish_run(run_id, "failed")
        ledger.close()
        raise
    ledger.close()
    return RunResult(run_id, data, tokens, summary, entropy, model.num_params())
