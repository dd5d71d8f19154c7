"""Two training steps of a recipe's model on random packed rows and an evaluation of its
largest validation batch (gradients still held, as after an update), in a process of
their own, for tests/train/test_memory.py: prints the resident memory before the model
exists and the process's peak resident memory (``VmHWM``) after them, as JSON.

    python memory_step.py '<recipe as JSON>' VOCAB
"""

from __future__ import annotations

import json
import resource
import sys

import numpy as np
import psutil

from ledgerlm.config import Recipe
from ledgerlm.lab.build import determinism
from ledgerlm.model.gpt import GPT
from ledgerlm.tokens.packing import batches, pack_documents
from ledgerlm.train.evaluate import evaluate
from ledgerlm.train.loop import Trainer
from ledgerlm.train.optim import build_optimizer


def main() -> None:
    recipe = Recipe.model_validate(json.loads(sys.argv[1]))
    vocab = int(sys.argv[2])
    t, seq = recipe.train, recipe.pack.seq_len
    rng = np.random.default_rng(0)
    docs = (
        (rng.integers(3, vocab, size=int(rng.integers(seq // 4, 2 * seq))), 0) for _ in range(10**9)
    )
    rows = pack_documents(docs, seq + 1, 1, 2, 0)
    stream = batches(rows, t.micro_batch_rows, recipe.pack.reset_positions)
    batch = next(stream)
    val_rows = min(t.micro_batch_rows, -(-recipe.eval.max_tokens // seq) + 1)
    val = next(batches(rows, val_rows, recipe.pack.reset_positions))
    before = psutil.Process().memory_info().rss
    determinism(t)
    model = GPT(recipe.model, vocab, device="meta")
    model.checkpoint_blocks = t.activation_checkpointing
    model.materialize("cpu")
    optimizer = build_optimizer(model, t)
    same = iter(lambda: batch, None)  # the same micro-batch, forever
    trainer = Trainer(model, optimizer, t, same, recipe.pack.attention)
    for _ in range(2):  # the second step holds the optimizer's state too
        trainer.train_step()
    with trainer.autocast():
        evaluate(model, [val], recipe.pack.attention, ["a"])
    print(json.dumps({"before": before, "peak": _peak_rss()}))


def _peak_rss() -> int:
    """This process's peak resident memory in bytes. Linux's ``VmHWM`` belongs to the
    program's own memory, made anew at exec; ``ru_maxrss`` also holds the peak of the
    parent's memory as the forked child shared it (a test runner grown large)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


if __name__ == "__main__":
    main()
