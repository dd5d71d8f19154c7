"""The GPU scripts of bench/: their arithmetic, and the sections a CPU can run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_train  # noqa: E402  (a script of bench/)
from ledgerlm.config import ModelConfig  # noqa: E402
from ledgerlm.model.gpt import GPT  # noqa: E402


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200 NVL", 835.0),  # not the SXM part's 989
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA L40", 181.0),  # not the L4's 121
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),  # not the A10's 125
        ("Tesla T4", None),
    ],
)
def test_the_longest_known_name_in_the_device_name_gives_the_peak(name, peak):
    assert gpu_train.peak_tflops(name) == peak


def test_flops_per_token_count_the_full_score_matrix_and_report_the_causal_half():
    cfg = ModelConfig(d_model=32, n_layers=3, n_heads=2)  # tied embeddings, the default
    model = GPT(cfg, 100)
    # every weight the forward multiplies by: the tied embedding matrix is the head's
    # matmul (the lookup itself multiplies nothing), counted once
    n = sum(p.numel() for p in model.parameters())
    n_full, full = gpu_train.flops_per_token(model, 64)
    _, causal = gpu_train.flops_per_token(model, 64, causal=True)
    assert n_full == n
    assert full == 6 * n + 12 * 3 * 32 * 64
    assert causal == 6 * n + 6 * 3 * 32 * 64


def _check(tmp_path: Path, *only: str) -> dict:
    out = tmp_path / "check.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--tiny"]
    cmd += ["--out", str(out), *(("--only", *only) if only else ())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return json.loads(out.read_text())["sections"]


def test_the_gpu_check_resumes_bitwise_and_shards_one_rank_on_the_cpu(tmp_path):
    sections = _check(tmp_path, "resume", "head_loss", "fsdp", "cuda_tests")
    assert sections["resume"]["ok"] and sections["resume"]["differing_tensors"] == []
    assert sections["head_loss"]["loss_rel_error"] < 1e-3
    fsdp = sections["fsdp"]
    assert fsdp["weights_dtypes_in_forward"] == ["torch.float64"]
    assert fsdp["losses_with_eval"] == fsdp["losses_plain"]
    assert fsdp["dcp_round_trip_equal"]
    assert sections["cuda_tests"] == {"ok": None, "skipped": "needs CUDA", "seconds": 0.0}


@pytest.mark.slow
def test_every_section_a_cpu_can_run_passes_in_the_tiny_check(tmp_path):
    sections = _check(tmp_path)
    ran = {name for name, result in sections.items() if result["ok"] is not None}
    cpu = {"trainer", "resume", "head_loss", "recompiles", "mask_build", "fsdp", "throughput"}
    assert ran == cpu
    assert all(sections[name]["ok"] for name in ran), {n: sections[n] for n in ran}
