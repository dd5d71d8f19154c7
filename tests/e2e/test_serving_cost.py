"""``scale serving-cost`` from the command line: a stated shape or a run's model, timed
and counted; and ``scale recommend --serving`` charging the measured cost."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cli_runner import TINY, ledgerlm
from ledgerlm.config import ModelConfig
from ledgerlm.lab.serving import read_serving_cost
from ledgerlm.model.decode import Decoder
from ledgerlm.model.gpt import GPT, RMSNorm
from ledgerlm.scaling.allocate import lifecycle_optimal
from ledgerlm.scaling.law import LawParams

SHAPE = "d_model=32,n_layers=2,n_heads=2,vocab=64"
TRUE = LawParams(E=1.7, A=400.0, B=410.0, alpha=0.34, beta=0.28)


def _cost(*args: str) -> dict:
    out = ledgerlm("scale", "serving-cost", *args, "--new-tokens", "4", "--repeats", "2", "--json")
    return json.loads(out.stdout)


@pytest.fixture
def law_csv(tmp_path):
    """6 sizes x 5 token counts of a known law."""
    lines = ["N,D,loss"]
    for n in np.logspace(7, 9, 6):
        for d in np.logspace(9, 11, 5):
            lines.append(f"{n:.6g},{d:.6g},{TRUE.predict(n, d):.6f}")
    path = tmp_path / "law.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _counted(context: int, batch: int = 2) -> tuple[int, float, float]:
    """(N, matmul, attention) FLOPs per token of the SHAPE model, counted without the
    code under test: N from the model's own parameter tensors (blocks, final norm,
    head); the FLOPs by torch's ``FlopCounterMode`` over one real cached decode step
    that attends ``context`` positions (a prefill of ``context - 1``), with the math
    attention kernel so QK^T and AV run as counted ``bmm``s."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(d_model=32, n_layers=2, n_heads=2), 64).eval()
    n = sum(p.numel() for p in model.blocks.parameters())
    n += sum(p.numel() for p in model.norm.parameters()) + model.lm_head.weight.numel()
    decoder = Decoder(model, context)
    token = decoder(torch.randint(0, 64, (batch, context - 1)))[:, -1].argmax(-1, keepdim=True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        decoder(token)
    counts = {str(op): f for op, f in counter.get_flop_counts()["Global"].items()}
    assert set(counts) == {"aten.mm", "aten.bmm"}
    # the convention's 2N also counts each norm weight once as a multiply-add
    norms = sum(
        p.numel() for m in model.modules() if isinstance(m, RMSNorm) for p in m.parameters()
    )
    return n, counts["aten.mm"] / batch + 2 * norms, counts["aten.bmm"] / batch


def test_serving_cost_of_a_stated_shape(tmp_path):
    out_file = tmp_path / "serving.json"
    shown = ledgerlm("scale", "serving-cost", "--model-shape", SHAPE, "--batch", "2",
                     "--context", "8", "--new-tokens", "4", "--repeats", "2",
                     "-o", str(out_file)).stdout  # fmt: skip
    assert "seconds / generated token" in shown and "training-equivalent" in shown
    assert "torch threads" in shown and f"--serving {out_file}" in shown
    short = json.loads(out_file.read_text())
    long = _cost("--model-shape", SHAPE, "--batch", "2", "--context", "40")
    assert short["schema"] == "ledgerlm.serving_cost" and short["schema_version"] == 1
    assert short["source"] == "shape" and short["batch"] == 2 and short["context"] == 8
    for r in (short, long):
        n, matmul, attention = _counted(r["context"])
        assert r["model"]["N"] == n
        assert r["flops_per_token"]["matmul"] == matmul
        assert r["flops_per_token"]["attention"] == attention
        assert r["flops_per_token"]["total"] == matmul + attention
        assert r["analytic_flops_per_param"] == pytest.approx((matmul + attention) / n)
        assert r["analytic_flops_per_param"] > 2  # the context costs on top of 2N
        assert r["seconds_per_token"] > 0 and r["train_seconds_per_token"] > 0
        assert r["tokens_per_s"] == pytest.approx(2 / r["step_seconds"])
        assert r["effective_flops_per_param"] == pytest.approx(
            6 * r["seconds_per_token"] / r["train_seconds_per_token"]
        )
    assert long["flops_per_token"]["attention"] > short["flops_per_token"]["attention"]
    # what `scale recommend --serving` reads from the file
    kappa, about = read_serving_cost(out_file)
    assert kappa == short["effective_flops_per_param"] and about["kind"] == "measured"


def test_serving_cost_refuses_bad_input():
    both = ledgerlm("scale", "serving-cost", "somerun", "--model-shape", SHAPE, check=False)
    assert both.returncode == 2 and "not both" in both.stderr
    bad = ledgerlm("scale", "serving-cost", "--model-shape", "d_model=32,layers=2", check=False)
    assert bad.returncode == 2 and "unknown key 'layers'" in bad.stderr


def _serving_file(path, kappa: float) -> None:
    """A ``scale serving-cost -o`` file with a known measured cost (the command's own
    output is checked above; a fixed figure keeps the allocation deterministic)."""
    data = {"schema": "ledgerlm.serving_cost", "schema_version": 1, "source": "shape",
            "batch": 4, "context": 256, "new_tokens": 16, "machine": "CPU test",
            "device": "cpu", "analytic_flops_per_param": 2.3,
            "effective_flops_per_param": kappa}  # fmt: skip
    path.write_text(json.dumps(data))


def test_recommend_charges_the_measured_serving_cost(tmp_path, law_csv):
    served = tmp_path / "serving.json"
    _serving_file(served, 12.5)
    args = ("scale", "recommend", "--csv", str(law_csv), "--budget", "1e20",
            "--requests", "0,1e9", "--bootstrap", "0")  # fmt: skip
    out = json.loads(ledgerlm(*args, "--serving", str(served), "--json").stdout)
    life = out["lifecycle"]
    assert life["inference_kappa"] == 12.5
    # the R = 1e9 row is the allocation at the measured 12.5 N FLOPs a served token, not
    # at the default 2: the lifecycle optimum of the fitted law, called here directly
    law = LawParams(**out["fit"]["params"])
    served_row = life["rows"][1]
    plan = {k: lifecycle_optimal(law, requests=1e9, tokens_per_request=1000.0, budget=1e20,
                                 inference_kappa=k) for k in (12.5, 2.0)}  # fmt: skip
    assert served_row["R"] == 1e9
    assert served_row["N"] == pytest.approx(plan[12.5].N, rel=1e-9)
    assert served_row["D"] == pytest.approx(plan[12.5].D, rel=1e-9)
    assert plan[2.0].N > 5 * plan[12.5].N  # the default's answer is far from it
    # and by arithmetic: the row spends the budget at 12.5 N FLOPs a served token ...
    n, d = served_row["N"], served_row["D"]
    assert served_row["C_inference_total"] == pytest.approx(1e9 * 1000 * 12.5 * n, rel=1e-9)
    assert 6 * n * d + 1e9 * 1000 * 12.5 * n == pytest.approx(1e20, rel=1e-9)
    # ... where the marginal returns balance along that budget line (allocate's S4 doc)
    lhs = law.alpha * law.A * n**-law.alpha
    assert lhs == pytest.approx(law.beta * law.B * d**-law.beta * 1e20 / (6 * n * d), rel=1e-6)
    # with no requests the row is the S3 optimum, which no serving cost moves
    assert life["rows"][0]["N"] == pytest.approx(out["N_opt"]["point"], rel=1e-12)
    assert life["serving"]["kind"] == "measured" and life["serving"]["context"] == 256
    stated = json.loads(ledgerlm(*args, "--serving-flops-per-param", "12.5", "--json").stdout)
    assert stated["lifecycle"]["serving"]["kind"] == "stated"
    assert stated["lifecycle"]["rows"] == life["rows"]  # the same k, the same allocation
    shown = ledgerlm(*args, "--serving", str(served)).stdout
    assert "12.5 N FLOPs a" in shown and "measured by `scale serving-cost`" in shown

    both = ledgerlm(*args, "--serving", str(served), "--serving-flops-per-param", "3",
                    check=False)  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
    not_ours = ledgerlm(*args, "--serving", str(law_csv), check=False)
    assert not_ours.returncode == 2 and "not JSON" in not_ours.stderr


@pytest.mark.slow
def test_serving_cost_of_a_run(tmp_path):
    ws = tmp_path / "ws"
    ledgerlm("run", str(TINY), "-w", str(ws), "--set", "train.max_steps=4",
             "--set", "eval.every_steps=2")  # fmt: skip
    r = _cost("tiny", "-w", str(ws), "--batch", "2", "--context", "32", "--threads", "1")
    assert r["source"].startswith("run tiny-") and r["threads"] == 1
    assert r["model"]["d_model"] == 64 and r["model"]["vocab"] == 512
    assert r["seconds_per_token"] > 0 and r["flops_per_token"]["attention"] == 4 * 2 * 32 * 64
