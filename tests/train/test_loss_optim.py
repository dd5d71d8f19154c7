import math

import pytest
import torch

from ledgerlm.config import TrainConfig
from ledgerlm.train.loss import NoTargetsError, objective_loss, per_target_loss
from ledgerlm.train.optim import (
    MultiOptimizer,
    adamw_kwargs,
    build_optimizer,
    lr_at,
    param_groups,
)


def token_mean_loss(logits, targets, loss_mask):
    """The token-mean objective the trainer reduces its per-target losses with."""
    return objective_loss(per_target_loss(logits, targets), loss_mask, "token_mean", "exclude")


def test_seed_l1_cross_entropy_is_stable_for_large_logits():
    logits = torch.tensor([[1000.0, 999.0]])
    loss = token_mean_loss(logits, torch.tensor([1]), torch.tensor([True]))
    assert float(loss) == pytest.approx(1.3133, abs=1e-4)


def test_seed_l1_single_position_value_and_gradient():
    z = torch.tensor([[math.log(2), 0.0, 0.0]], requires_grad=True)
    loss = token_mean_loss(z, torch.tensor([2]), torch.tensor([True]))
    loss.backward()
    assert loss.item() == pytest.approx(1.3863, abs=1e-4)
    assert z.grad[0].tolist() == pytest.approx([0.5, 0.25, -0.75], abs=1e-6)


def test_batch_without_targets_is_an_error():
    with pytest.raises(NoTargetsError):
        token_mean_loss(torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor([False, False]))


def test_seed_l4_adamw_decoupled_decay_one_step():
    layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    cfg = TrainConfig(lr=0.01, weight_decay=0.1, betas=(0.9, 0.999))
    opt = build_optimizer(layer, cfg)
    layer.weight.grad = torch.full_like(layer.weight, 0.2)
    opt.step()
    assert layer.weight.item() == pytest.approx(0.989, abs=1e-6)


def test_no_decay_on_norms_and_embeddings():
    from ledgerlm.config import ModelConfig
    from ledgerlm.model.gpt import GPT

    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2), 40)
    decay, no_decay = param_groups(model, 0.1)
    decayed = {id(p) for p in decay["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names and all(n.startswith("blocks.") and "norm" not in n for n in names)
    assert id(model.embed.weight) in {id(p) for p in no_decay["params"]}


def test_seed_l5_linear_warmup_is_at_half_peak_halfway():
    cfg = TrainConfig(lr=1.0, warmup_steps=1000, max_steps=10_000, min_lr_ratio=0.1)
    assert lr_at(500, cfg) == pytest.approx(0.5)
    assert lr_at(1000, cfg) == pytest.approx(1.0)
    assert lr_at(10_000, cfg) == pytest.approx(0.1)
    assert lr_at(5500, cfg) == pytest.approx(0.55)  # cosine midpoint between peak and floor
    with pytest.raises(ValueError):
        lr_at(0, cfg)


def _tiny_gpt(tie: bool = True):
    from ledgerlm.config import ModelConfig
    from ledgerlm.model.gpt import GPT

    torch.manual_seed(0)
    return GPT(ModelConfig(d_model=16, n_layers=2, n_heads=2, tie_embeddings=tie), 40)


def test_adamw_is_the_default_and_each_group_keeps_its_peak():
    model = _tiny_gpt()
    opt = build_optimizer(model, TrainConfig(lr=0.01))
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["base_lr"] for g in opt.param_groups] == [0.01, 0.01]


def test_adamw_takes_the_fused_kernel_on_cuda_and_on_the_cpu():
    """The kernel is chosen by the parameters' device, sharded (DTensor) or not: fused
    on CUDA (torch would pick foreach) and on the CPU (torch would loop in Python)."""
    assert adamw_kwargs("cuda") == {"fused": True}
    assert adamw_kwargs("cpu") == {"fused": True}
    assert adamw_kwargs("mps") == {}  # elsewhere torch's default
    opt = build_optimizer(_tiny_gpt(), TrainConfig())
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
    muon = build_optimizer(_tiny_gpt(), TrainConfig(optimizer="muon"))
    assert muon.optimizers["adamw"].defaults["fused"] is True


@pytest.mark.parametrize("tie", [True, False])
def test_muon_takes_block_matrices_and_adamw_the_rest(tie):
    model = _tiny_gpt(tie)
    opt = build_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    assert isinstance(opt, MultiOptimizer)
    assert isinstance(opt.optimizers["muon"], torch.optim.Muon)
    assert isinstance(opt.optimizers["adamw"], torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.optimizers["muon"].param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in opt.optimizers["adamw"].param_groups for p in g["params"]]
    assert set(muon) == {n for n, p in model.named_parameters() if "blocks." in n and p.dim() == 2}
    assert len(muon) == 2 * 7  # q, k, v, o, gate, up, down per block
    assert "embed.weight" in adamw and "norm.weight" in adamw
    assert any("attn_norm" in n for n in adamw) and ("lm_head.weight" in adamw) != tie
    assert sorted(muon + adamw) == sorted(names.values())  # every parameter exactly once
    peak = {g["base_lr"]: n for n, o in opt.optimizers.items() for g in o.param_groups}
    assert peak == {0.02: "muon", 1e-3: "adamw"}
    # the loop sees every group; the decay group is empty (its matrices went to Muon)
    assert len(opt.param_groups) == 2


def test_muon_training_decreases_the_loss_on_a_repeated_batch():
    import itertools

    import numpy as np

    from ledgerlm.tokens.packing import batches, pack_documents
    from ledgerlm.train.loop import Trainer

    rng = np.random.default_rng(0)
    docs = [(rng.integers(3, 40, size=12), 0) for _ in range(8)]
    batch = next(batches(pack_documents(docs, 17, 1, 2, 0), 8))
    model = _tiny_gpt()
    cfg = TrainConfig(
        optimizer="muon", lr=3e-3, muon_lr=0.02, warmup_steps=0, schedule="constant", max_steps=20
    )
    trainer = Trainer(model, build_optimizer(model, cfg), cfg, itertools.repeat(batch), "isolated")
    before = [p.detach().clone() for p in model.parameters()]
    state = trainer.fit()
    losses = [r.loss for r in state.history]
    assert state.step == 20 and losses[-1] < losses[0] - 0.5
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_multi_optimizer_state_round_trips():
    model = _tiny_gpt()
    cfg = TrainConfig(optimizer="muon")
    opt = build_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    state = opt.state_dict()
    assert set(state) == {"adamw", "muon"}
    other = build_optimizer(model, cfg)
    other.load_state_dict(state)
    assert other.state_dict()["muon"]["state"].keys() == state["muon"]["state"].keys()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError):
        other.load_state_dict({"adamw": state["adamw"]})
