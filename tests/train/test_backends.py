"""What a run fixes of its device at set-up (TF32, NCCL's algorithm) and what it records
of it. The switches are process flags and environment variables: setting them needs no
GPU, so the CUDA decisions are checked here on the CPU; what only a GPU can answer (its
name, the CUDA and NCCL versions) is skipped without one."""

import json
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from ledgerlm.config import TrainConfig, load_recipe
from ledgerlm.train import backends
from ledgerlm.train.backends import (
    NCCL_PINNED,
    environment,
    pin_nccl,
    set_tf32,
    set_up,
    tf32_note,
)
from ledgerlm.train.distributed import World

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.toml"
GPUS = World(rank=0, size=2, device=torch.device("cuda", 0))  # two ranks on GPUs


@pytest.fixture
def tf32_flags():
    """Leave torch's TF32 switches as the test found them."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def no_nccl(monkeypatch):
    """No NCCL_* variable in this process; whatever the test sets is removed after it,
    also what the code under test writes into ``os.environ`` itself (each name is set
    once through monkeypatch first, so that its undo restores the name's absence)."""
    for name in [k for k in os.environ if k.startswith("NCCL_")] + list(NCCL_PINNED):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def test_tf32_is_a_recipe_key_off_by_default():
    assert TrainConfig().tf32 is False  # fp32 recipes stay exact
    recipe = load_recipe(TINY, ["train.tf32=true"])
    assert recipe.train.tf32 is True
    assert recipe.to_dict()["train"]["tf32"] is True  # the recipe the ledger keeps
    assert recipe.digest() != load_recipe(TINY).digest()  # a checkpoint resumes only its own
    with pytest.raises(ValidationError, match="tf32"):
        TrainConfig(tf32="sometimes")


def test_tf32_is_set_on_cuda_either_way_and_the_cpu_is_left_alone(tf32_flags):
    cuda = torch.device("cuda", 0)
    assert set_tf32(TrainConfig(tf32=True), cuda) is True
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert set_tf32(TrainConfig(tf32=False), cuda) is False
    # off means off, whatever ran before in the process (cuDNN's default is on)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    assert set_tf32(TrainConfig(tf32=True), torch.device("cpu")) is False
    assert set_tf32(TrainConfig(tf32=False), torch.device("cpu")) is False
    assert torch.backends.cuda.matmul.allow_tf32  # not touched on the CPU
    assert environment(World())["tf32"] is False  # and the CPU's record says no TF32


def test_tf32_on_the_cpu_is_said_once_not_refused():
    note = tf32_note(TrainConfig(tf32=True), World())
    assert note is not None and "changes nothing on cpu" in note
    assert tf32_note(TrainConfig(), World()) is None
    assert tf32_note(TrainConfig(tf32=True), World(device=torch.device("cuda", 0))) is None


def test_nccl_is_pinned_on_gpus_under_torchrun_and_a_users_choice_is_kept():
    env = {}
    assert pin_nccl(GPUS, env) == NCCL_PINNED and env == NCCL_PINNED
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_NVLS_ENABLE"] == "0"
    chosen = {"NCCL_ALGO": "Tree"}  # exported by the user
    assert "NCCL_ALGO" not in pin_nccl(GPUS, chosen) and chosen["NCCL_ALGO"] == "Tree"
    for world in (World(rank=0, size=2), World(device=torch.device("cuda", 0))):
        untouched = {}  # gloo on the CPU, or one GPU: no NCCL communicator at all
        assert pin_nccl(world, untouched) == {} and untouched == {}


def test_set_up_pins_nccl_in_the_process_environment(no_nccl, tf32_flags):
    set_up(TrainConfig(), GPUS)
    assert {k: os.environ.get(k) for k in NCCL_PINNED} == NCCL_PINNED
    assert not torch.backends.cuda.matmul.allow_tf32  # and TF32 as the recipe says: off


def test_a_run_that_is_not_deterministic_leaves_nccl_free(no_nccl, tf32_flags):
    set_up(TrainConfig(deterministic=False), GPUS)
    assert not any(k in os.environ for k in NCCL_PINNED)


def test_set_up_without_the_pin_is_caught(no_nccl, tf32_flags):
    """Mutation check: a set-up that forgets NCCL leaves the environment as it was."""
    no_nccl.setattr(backends, "pin_nccl", lambda world, environ=None: {})
    set_up(TrainConfig(), GPUS)
    assert not any(k in os.environ for k in NCCL_PINNED)


def test_the_record_holds_every_nccl_variable_in_force(no_nccl):
    no_nccl.setenv("NCCL_ALGO", "Ring")
    no_nccl.setenv("NCCL_NVLS_ENABLE", "0")
    no_nccl.setenv("NCCL_DEBUG", "WARN")
    no_nccl.setenv("NCCLX_CONFIG", "not NCCL's")
    record = environment(World())
    assert record["nccl"] == {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN", "NCCL_NVLS_ENABLE": "0"}
    assert record["device"] == "cpu" and record["ranks"] == 1
    assert record["torch"] == torch.__version__ and record["tf32"] is False
    assert json.loads(json.dumps(record)) == record  # an event's JSON message
    no_nccl.delenv("NCCL_DEBUG")
    assert "NCCL_DEBUG" not in environment(World())["nccl"]  # read when recorded


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the GPU's name, versions")
def test_on_cuda_the_record_names_the_gpu_and_the_versions(tf32_flags):
    world = World(device=torch.device("cuda", 0))
    set_tf32(TrainConfig(tf32=True), world.device)
    record = environment(world)
    assert record["tf32"] is True and record["device"] == "cuda:0"
    assert record["device_name"] == torch.cuda.get_device_name(0)
    assert record["cuda"] == torch.version.cuda
    if torch.distributed.is_nccl_available():
        assert record["nccl_version"].startswith(str(torch.cuda.nccl.version()[0]))
