"""The memory estimate of a training step against the peak resident memory of real steps,
and the refusal of a recipe that cannot fit (one line: the estimate, the limit, what to
change)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerlm.config import Recipe
from ledgerlm.train.distributed import World
from ledgerlm.train.memory import (
    GIB,
    MARGIN,
    WontFitError,
    _cgroup_room,
    check_memory,
    estimate,
    known_vocab,
)

STEP = Path(__file__).with_name("memory_step.py")

# (name, recipe, vocabulary): activations of many rows; long rows, where the (B, 1, T, T)
# masks SDPA keeps on the CPU weigh most; weights and Muon's state, under bf16 autocast
# with activation checkpointing; an evaluation on a vocabulary whose whole logits would
# outweigh the step (its head is scored in chunks: an estimate with the whole logits is
# 2.5x the peak measured).
SHAPES = [
    (
        "many rows",
        {"model": {"d_model": 64, "n_layers": 2, "n_heads": 2}, "train": {"micro_batch_rows": 256}},
        512,
    ),
    (
        "long rows",
        {
            "pack": {"seq_len": 1024},
            "model": {"d_model": 64, "n_layers": 4, "n_heads": 2},
            "train": {"micro_batch_rows": 8},
        },
        512,
    ),
    (
        "wide, muon, bf16, checkpointed",
        {
            "model": {"d_model": 512, "n_layers": 2, "n_heads": 4},
            "train": {
                "micro_batch_rows": 32,
                "optimizer": "muon",
                "precision": "bf16",
                "activation_checkpointing": True,
            },
        },
        8192,
    ),
    (
        "large-vocabulary evaluation",
        {
            "pack": {"seq_len": 256},
            "model": {"d_model": 64, "n_layers": 2, "n_heads": 2},
            "train": {"micro_batch_rows": 16},
            "eval": {"max_tokens": 4096},
        },
        8192,
    ),
]


def _recipe(tree: dict) -> Recipe:
    tree = json.loads(json.dumps(tree))
    tree.setdefault("pack", {}).setdefault("seq_len", 64)
    tree.setdefault("train", {})["threads"] = 1
    tree.setdefault("eval", {}).setdefault("max_tokens", 16)  # by default a 1-row batch
    return Recipe.model_validate(tree)


# bf16 matmuls on a CPU without AVX-512 BF16 are emulated: 199 s on such a 2-core
# machine, 176 s on CI's
SLOW = {"wide, muon, bf16, checkpointed"}


@pytest.mark.parametrize(
    ("name", "tree", "vocab"),
    [pytest.param(*s, id=s[0], marks=[pytest.mark.slow] if s[0] in SLOW else []) for s in SHAPES],
)
def test_estimate_is_close_to_the_peak_of_real_steps(name, tree, vocab):
    """Two real training steps and an evaluation in a fresh process: the estimate is
    within 0.75x..1.5x of the rise of its peak resident memory, and the larger of the
    step's activations and the evaluation alone within 0.5x..2x of what the rest leaves
    (measured over two runs: 1.07-1.11x, 1.18-1.19x, 1.07-1.17x, 1.06-1.09x)."""
    recipe = _recipe(tree)
    proc = subprocess.run(
        [sys.executable, str(STEP), json.dumps(recipe.to_dict()), str(vocab)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)
    rise = measured["peak"] - measured["before"]
    need = estimate(recipe, vocab, World())
    assert 0.75 <= need.total / rise <= 1.5, (name, need.total / rise, need.parts(), rise)
    work = max(need.activations, need.evaluation)
    rest = need.total - work
    assert 0.5 <= work / (rise - rest) <= 2, (name, need.parts(), rise)


def _tiny(**train) -> Recipe:
    return Recipe.model_validate(
        {
            "pack": {"seq_len": 64},
            "model": {"d_model": 64, "n_layers": 2, "n_heads": 2},
            "tokenizer": {"vocab_size": 512},
            "train": train,
            "eval": {"max_tokens": 6144},
        }
    )


def test_a_recipe_too_large_is_refused_with_the_estimate_the_limit_and_the_rows_that_fit():
    room = (20 * GIB, "of RAM available")
    recipe = _tiny(micro_batch_rows=100_000)
    with pytest.raises(WontFitError) as caught:
        check_memory(recipe, World(), room=room)
    line = str(caught.value)
    assert "\n" not in line
    found = re.fullmatch(
        r"train: the recipe needs about ([\d.]+) GiB \(parameters [\d.]+, gradients [\d.]+, "
        r"optimizer [\d.]+, activations [\d.]+ for 100,000 rows x 64 tokens, evaluation "
        r"[\d.]+, other [\d.]+\) per process, more than 90% of the 20.0 GiB of RAM "
        r"available; lower train.micro_batch_rows to ([\d,]+) or fewer \(a larger "
        r"train.grad_accum keeps the batch\), or set train.memory_check = false to train "
        r"anyway",
        line,
    )
    assert found, line
    assert float(found[1]) > 20
    rows = int(found[2].replace(",", ""))  # the most rows that fit, and no more
    fits = check_memory(_tiny(micro_batch_rows=rows), World(), room=room)
    assert fits is not None and fits.total <= MARGIN * room[0]
    with pytest.raises(WontFitError):
        check_memory(_tiny(micro_batch_rows=rows + 1), World(), room=room)


def test_a_model_too_large_is_refused_with_the_model_to_change():
    recipe = _tiny().model_copy(
        update={"model": _tiny().model.model_copy(update={"d_model": 4096})}
    )
    with pytest.raises(WontFitError, match=r"parameters 1\.5, gradients 1\.5, optimizer 3\.0") as e:
        check_memory(recipe, World(), room=(6 * GIB, "left under the address-space limit"))
    assert "use a smaller model (model.d_model, model.n_layers)" in str(e.value)


def test_activation_checkpointing_is_advised_when_it_alone_makes_the_recipe_fit():
    recipe = _tiny(micro_batch_rows=2048)
    plain = estimate(recipe, 512, World()).total
    checkpointed = estimate(
        _tiny(micro_batch_rows=2048, activation_checkpointing=True), 512, World()
    )
    room = (int((plain + checkpointed.total) / 2 / MARGIN), "of RAM available")
    with pytest.raises(WontFitError, match=r"set train\.activation_checkpointing = true, or"):
        check_memory(recipe, World(), room=room)


def test_the_check_can_be_turned_off_and_waits_for_an_unknown_vocabulary():
    huge = _tiny(micro_batch_rows=100_000, memory_check=False)
    assert check_memory(huge, World(), room=(GIB, "of RAM available")) is None
    supplied = _tiny().model_copy(
        update={"tokenizer": _tiny().tokenizer.model_copy(update={"reuse": "tokens-x"})}
    )
    assert known_vocab(supplied) is None and known_vocab(_tiny()) == 512
    assert check_memory(supplied, World(), room=(GIB, "of RAM available")) is None
    with pytest.raises(WontFitError):  # once the token version tells it
        check_memory(
            supplied.model_copy(
                update={"train": huge.train.model_copy(update={"memory_check": True})}
            ),
            World(),
            512,
            room=(GIB, "of RAM available"),
        )


def test_sharding_divides_the_weights_and_ddp_adds_its_buckets():
    recipe = _tiny().model_copy(
        update={"model": _tiny().model.model_copy(update={"d_model": 256, "n_layers": 8})}
    )
    one = estimate(recipe, 512, World())
    fsdp = estimate(recipe, 512, World(size=4, parallel="fsdp"))
    ddp = estimate(recipe, 512, World(size=4, parallel="ddp"))
    assert fsdp.parameters < one.parameters and fsdp.optimizer < one.optimizer
    assert ddp.parameters == one.parameters and ddp.gradients == 2 * one.gradients
    assert fsdp.activations == one.activations  # each rank runs whole micro-batches
    # accumulating, a rank holds the whole gradients until the last micro-batch scatters
    accum = recipe.model_copy(update={"train": recipe.train.model_copy(update={"grad_accum": 2})})
    deferred = estimate(accum, 512, World(size=4, parallel="fsdp"))
    assert fsdp.gradients < one.gradients < deferred.gradients


def _group(folder: Path, limit: str, usage: int, inactive: int, v2: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = (
        ("memory.max", "memory.current")
        if v2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"active_file 5\ninactive_file {inactive}\n")


def test_cgroup_room_is_the_tightest_limit_above_the_process(tmp_path):
    mib = 2**20
    # v2: its own group is unlimited, its parent allows 1 GiB and holds 700 MiB, 100 of
    # which is page cache that can be dropped
    _group(tmp_path / "jobs" / "one", "max", 300 * mib, 0, v2=True)
    _group(tmp_path / "jobs", str(1024 * mib), 700 * mib, 100 * mib, v2=True)
    assert _cgroup_room(tmp_path, "0::/jobs/one\n") == 424 * mib
    # v1, among other controllers, with "no limit" written as a huge number
    v1 = tmp_path / "v1"
    _group(v1 / "memory" / "job", str(2**63 - 4096), mib, 0, v2=False)
    assert _cgroup_room(v1, "9:name=systemd:/\n4:memory:/job\n0::/\n") is None
    _group(v1 / "memory" / "job", str(512 * mib), 600 * mib, 0, v2=False)
    assert _cgroup_room(v1, "4:cpu,memory:/job\n") == 0  # over its limit: no room


def test_the_measured_peak_is_the_step_process_own():
    """A test runner grown large must not inflate the measurement: ``ru_maxrss`` of a
    forked child holds the parent's peak; ``memory_step`` reads its own program's."""
    big = bytearray(600 * 2**20)
    big[::4096] = b"\x01" * len(big[::4096])  # resident, not only reserved
    code = f"import sys; sys.path.insert(0, {str(STEP.parent)!r}); import memory_step; "
    code += "print(memory_step._peak_rss())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) < len(big) / 2, out.stdout
    del big
