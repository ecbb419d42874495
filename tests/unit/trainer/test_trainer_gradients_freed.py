"""The trainer frees every gradient after each mini-batch's optimizer step: none is held between steps, where
a colocated engine generates beside the trainer's state (``runtime.switch``), for the policy, LoRA adapters,
a separate critic, a shared trunk's value head and a critic warming up alone; a step that fails frees them
too."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.testing.gradients import stepped_gradients, trained_parameters
from asyncrl.trainer.optim import build_optimizer
from asyncrl.trainer.trainer import Trainer

CASES = {
    "policy, 2 mini-batches": ({"num_mini_batches": 2}, None),
    "lora": ({"lora": LoraConfig(rank=4, alpha=8.0)}, None),
    "separate critic": ({}, CriticConfig(type="separate")),
    "shared trunk": ({}, CriticConfig(type="shared_trunk")),
    "separate critic warming up": ({}, CriticConfig(type="separate", warmup_steps=1)),
    "shared trunk warming up": ({}, CriticConfig(type="shared_trunk", warmup_steps=1)),
}


def trainer_of(config: dict, critic: CriticConfig | None) -> Trainer:
    return Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-3, **config),
        LossConfig(),
        AdvantageConfig(name="gae" if critic else "grpo"),
        critic=critic,
    )


def groups():
    return with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)


@pytest.mark.parametrize("case", list(CASES))
def test_no_gradient_outlives_its_optimizer_step(case):
    trainer = trainer_of(*CASES[case])
    with stepped_gradients(trainer) as stepped:
        trainer.train_step(groups(), policy_version=0)
    # the step did compute gradients, one set per mini-batch ...
    assert len(stepped) == trainer.config.num_mini_batches and all(stepped)
    assert max(float(g.abs().max()) for g in stepped[-1].values()) > 0
    # ... and holds none of them now
    assert [name for name, p in trained_parameters(trainer) if p.grad is not None] == []


def test_a_failed_optimizer_step_frees_its_gradients(monkeypatch):
    trainer = trainer_of({}, CriticConfig(type="separate"))

    def failed() -> dict[str, float]:
        assert any(p.grad is not None for _, p in trained_parameters(trainer))  # computed before the step
        raise RuntimeError("optimizer step failed")

    monkeypatch.setattr(trainer, "_step_optimizers", failed)
    with pytest.raises(RuntimeError, match="optimizer step failed"):
        trainer.train_step(groups(), policy_version=0)
    assert [name for name, p in trained_parameters(trainer) if p.grad is not None] == []


def test_gradients_read_within_the_step_equal_what_the_optimizer_stepped_with():
    """``stepped_gradients`` reads after the clip and step (the gradients the update used), as ``param.grad``
    showed before they were freed: the same optimizer stepped from them on a copy lands on the same weights."""
    trainer = trainer_of({"max_grad_norm": 0.01}, None)  # a clip that bites: the read must be after it
    replica = copy.deepcopy(trainer.model)
    with stepped_gradients(trainer) as stepped:
        metrics = trainer.train_step(groups(), policy_version=0)
    assert metrics["grad_norm"] > 0.01
    ((grads),) = stepped
    optimizer = build_optimizer(replica, trainer.config, lr=metrics["lr"])
    for name, p in replica.named_parameters():
        p.grad = grads.get(name)
    optimizer.step()
    for (name, got), want in zip(trainer.model.named_parameters(), replica.parameters(), strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=0, msg=name)
