import math

import pytest
import torch

from ledgerlm.config import TrainConfig
from ledgerlm.train.loss import NoTargetsError, cross_entropy_sum, token_mean_loss
from ledgerlm.train.optim import build_optimizer, lr_at, param_groups


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
        cross_entropy_sum(torch.zeros(2, 3), torch.tensor([0, 1]), torch.tensor([False, False]))


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
