"""What a run fixes before it builds anything: deterministic kernels, on CUDA too."""

from __future__ import annotations

import os

import pytest
import torch

from ledgerlm.config import TrainConfig
from ledgerlm.lab.build import determinism


@pytest.fixture
def restored():
    """Leave torch's global switches as the test found them."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(strict)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def test_cublas_gets_the_fixed_workspace_deterministic_kernels_need(monkeypatch, restored):
    # torch refuses a CUDA matmul under deterministic algorithms without this variable
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    determinism(TrainConfig(threads=1))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    # no NaN-fill of every new allocation: it costs a write of each activation on a GPU
    assert torch.utils.deterministic.fill_uninitialized_memory is False


def test_a_recipe_may_let_torch_choose_faster_kernels(monkeypatch, restored):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(True)
    determinism(TrainConfig(threads=1, deterministic=False))
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_workspace_the_user_chose_is_kept(monkeypatch, restored):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    determinism(TrainConfig(threads=1))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
