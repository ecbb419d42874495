"""The learning-rate schedule (exact values), AdamW parameter groups, gradient clipping and TrainerConfig errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.optim import build_optimizer, build_scheduler, clip_gradients, lr_multiplier


def test_linear_warmup_then_constant():
    config = TrainerConfig(lr=1.0, warmup_steps=3)
    assert [lr_multiplier(s, config) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_decays_to_min_ratio_and_holds():
    config = TrainerConfig(lr=1.0, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.1)
    values = [lr_multiplier(s, config) for s in range(8)]
    expected = [1 / 3, 2 / 3, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 0.55]
    expected += [0.1 + 0.9 * 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.1, 0.1]
    assert values == pytest.approx(expected, abs=1e-12)


def test_scheduler_follows_the_multiplier():
    model = nn.Linear(2, 2)
    config = TrainerConfig(lr=0.2, warmup_steps=1)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.2, 0.2])


def test_one_dimensional_parameters_do_not_decay():
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, TrainerConfig(weight_decay=0.1))
    decays = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decays == {id(model.weight): 0.1, id(model.bias): 0.0}


def test_clip_gradients_returns_the_norm_before_clipping():
    param = nn.Parameter(torch.zeros(2))
    param.grad = torch.tensor([3.0, 4.0])
    assert clip_gradients([param], max_norm=1.0) == pytest.approx(5.0)
    assert param.grad.tolist() == pytest.approx([0.6, 0.8], abs=1e-6)
    param.grad = torch.tensor([3.0, 4.0])
    assert clip_gradients([param], max_norm=None) == pytest.approx(5.0)
    assert param.grad.tolist() == [3.0, 4.0]
    assert clip_gradients([nn.Parameter(torch.zeros(1))], max_norm=1.0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0.0}, "trainer.lr must be > 0"),
        ({"schedule": "cosine"}, "trainer.total_steps must be set"),
        ({"schedule": "linear"}, "trainer.schedule must be one of 'constant', 'cosine'"),
        ({"max_tokens_per_microbatch": 0}, "trainer.max_tokens_per_microbatch must be >= 1"),
        ({"compute_dtype": "fp8"}, "trainer.compute_dtype must be one of"),
        ({"betas": (0.9, 1.0)}, "trainer.betas must both be in"),
        ({"max_grad_norm": 0.0}, "trainer.max_grad_norm must be > 0 or null"),
        ({"fsdp_grad_accumulation": "lazy"}, "trainer.fsdp_grad_accumulation must be one of"),
    ],
)
def test_config_errors_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**kwargs)
