"""The memory check counts an exact task's generation: its prefill makes the decoder's
(B, T, V) logits whole, which the validation forward (its head in chunks) never does, so
at a vocabulary past one head chunk the estimate must grow by them."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ledgerlm.config import Recipe
from ledgerlm.model.gpt import GPT
from ledgerlm.tasks.generate import generate_batch
from ledgerlm.train.distributed import World
from ledgerlm.train.memory import estimate

V, SEQ, ROWS, NEW = 8192, 64, 8, 4  # logits of 16 MiB: past the CPU's 8 MiB head chunk


class Largest(TorchDispatchMode):
    """The most bytes of any tensor an op returns while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        sizes = [t.numel() * t.element_size() for t in tensors]
        self.bytes = max([self.bytes, *sizes])
        return out


def _recipe(tasks: list[dict]) -> Recipe:
    return Recipe.model_validate(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
            "pack": {"seq_len": SEQ},
            "train": {"micro_batch_rows": ROWS},
            "eval": {"tasks": tasks},
        }
    )


def test_an_exact_task_s_prefill_is_in_the_evaluation_estimate():
    recipe = _recipe([{"name": "sums", "path": "sums.jsonl", "kind": "exact"}])
    torch.manual_seed(0)
    model = GPT(recipe.model, V).eval()
    prompts = torch.randint(3, V, (ROWS, SEQ - NEW)).tolist()
    with Largest() as largest:
        generate_batch(model, prompts, NEW, None, stop=[], eos=None)
    made = largest.bytes
    assert made >= ROWS * (SEQ - NEW) * V * 4  # the prefill's logits, whole
    with_exact = estimate(recipe, V, World()).evaluation
    without = estimate(_recipe([{"name": "t", "path": "t.jsonl", "kind": "bpb"}]), V, World())
    assert without.evaluation < made <= with_exact
