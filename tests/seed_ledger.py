"""The requirement T4 seed ledger: runs written straight through the Ledger API, no training."""

from __future__ import annotations

from ledgerlm.ledger import Ledger

THRESHOLD = 3.0
EVERY = 500  # updates between evaluations
EVAL_SECONDS = 20.0
TOKENS_PER_STEP = 4096
TARGETS_PER_STEP = 4000


def loss(step: int, cross_step: int) -> float:
    """A straight loss curve that reaches THRESHOLD exactly at ``cross_step``."""
    return THRESHOLD + (cross_step - step) / 1000


def seed_run(
    ledger: Ledger,
    name: str,
    recipe: dict | None = None,
    *,
    steps: int,
    sec_per_step: float,
    cross_step: int,
    prep: float = 0.0,
    threshold: float = THRESHOLD,
    test_loss: float | None = None,
    checkpoint: bool = False,
    finish: str | None = None,
) -> str:
    """requirement T4: eval every 500 steps, each eval phase 20 s, val_loss reaching THRESHOLD at
    ``cross_step``.

    ``threshold`` is the run's target only: the curve stays the same, so a run with
    another target is not comparable with one at THRESHOLD. ``test_loss`` adds a test
    metric on the same slope, ``checkpoint`` a 5 s checkpoint phase at the end, and
    ``finish`` a final run status."""
    run = ledger.create_run(
        name,
        {"seed": 0} if recipe is None else recipe,
        target_metric="val_loss",
        target_value=threshold,
        eval_every=EVERY,
    )
    if prep:
        ledger.record_phase(run, "prep", prep)
    for end in range(EVERY, steps + 1, EVERY):
        ledger.record_phase(
            run, "train", EVERY * sec_per_step, step_start=end - EVERY, step_end=end
        )
        eval_id = ledger.record_phase(run, "eval", EVAL_SECONDS, step_start=end, step_end=end)
        metrics = {"val_loss": loss(end, cross_step)}
        if test_loss is not None:
            metrics["test_loss"] = test_loss + (cross_step - end) / 1000
        ledger.add_evaluation(
            run,
            step=end,
            tokens=end * TOKENS_PER_STEP,
            targets=end * TARGETS_PER_STEP,
            updates=end,
            metrics=metrics,
            snapshot=f"step-{end}",
            phase_id=eval_id,
        )
    if checkpoint:
        ledger.record_phase(run, "checkpoint", 5.0, step_start=steps)
    if finish is not None:
        ledger.finish_run(run, finish)
    return run
