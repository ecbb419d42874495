"""``deterministic``: the behaviour log-probs the loss uses for tokens of the current weights are the trainer's own
recompute, so engine noise in them (which depends on batch composition and timing) cannot reach the weights;
tokens of older versions keep the engine's values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.base import ConfigError
from asyncrl.config.critic import CriticConfig
from asyncrl.config.run import load_run_config
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.trainer.batching import build_train_batch
from asyncrl.trainer.trainer import Trainer, own_behaviour
from asyncrl.types import Group

VARIANTS = {
    "full": {},
    "lora": {"trainer": {"lora": LoraConfig(rank=4, dropout=0.1)}},
    "shared-trunk critic": {"advantage": "gae", "critic": CriticConfig(type="shared_trunk")},
    "separate critic": {"advantage": "gae", "critic": CriticConfig(type="separate")},
}
"""Full weights, LoRA adapters (with adapter dropout), and GAE with either critic (whose values come from the
same step-start forward as the recompute when the head is on the policy's trunk)."""


def trained_weights(groups: list[Group], recompute: bool, variant: str = "full") -> dict[str, torch.Tensor]:
    spec = VARIANTS[variant]
    trainer = Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-2, num_mini_batches=2, ppo_epochs=2, **spec.get("trainer", {})),
        LossConfig(name="ppo"),
        AdvantageConfig(name=spec.get("advantage", "grpo")),
        critic=spec.get("critic"),
        recompute_behaviour=recompute,
    )
    for step in range(2):
        trainer.train_step([shift_versions(g, step) for g in groups], policy_version=step)
    critic = trainer.critic.module.named_parameters() if trainer.critic is not None else []
    return {name: p.detach().clone() for name, p in [*trainer.model.named_parameters(), *critic]}


def shift_versions(group: Group, version: int) -> Group:
    """``group`` as generated at ``version`` (its model tokens' versions and start version set to it)."""
    trajectories = [
        dataclasses.replace(t, versions=[version if v >= 0 else v for v in t.versions], start_version=version)
        for t in group.trajectories
    ]
    return Group(prompt_uid=group.prompt_uid, trajectories=trajectories)


def noisy(seed: int) -> list[Group]:
    """The same groups with the model's log-probs blurred by engine-like noise of ``seed``."""
    return with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=3), tiny_qwen2(), 1e-4, seed)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_engine_noise_on_current_tokens_no_longer_reaches_the_weights(variant):
    first, second = trained_weights(noisy(1), True, variant), trained_weights(noisy(2), True, variant)
    assert all(torch.equal(first[n], second[n]) for n in first)
    plain_first, plain_second = (
        trained_weights(noisy(1), False, variant),
        trained_weights(noisy(2), False, variant),
    )
    assert any(not torch.equal(plain_first[n], plain_second[n]) for n in plain_first)  # the noise does matter


def test_only_tokens_of_the_current_version_take_the_trainers_log_probs():
    groups = noisy(1)
    batch = build_train_batch(groups, [0.0] * 8)
    versions = batch.token_versions.clone()
    versions[batch.loss_mask > 0] = 6  # every model token from the current version, but row 1's
    versions[1] = torch.where(batch.loss_mask[1] > 0, 5, versions[1])
    batch = dataclasses.replace(batch, token_versions=versions)
    policy = torch.full_like(batch.behaviour_logprobs, -7.0)
    replaced = own_behaviour(batch, policy, version=6)
    assert torch.equal(replaced[1], batch.behaviour_logprobs[1])
    current = (versions == 6) & (batch.loss_mask > 0)
    assert torch.equal(replaced[current], policy[current])
    assert torch.equal(replaced[~current], batch.behaviour_logprobs[~current])
    assert bool(current.any())


def test_deterministic_needs_rollouts_of_the_models_own_distribution():
    assert load_run_config(None, ["deterministic=true"]).deterministic
    with pytest.raises(ConfigError, match="needs rollout.top_p 1"):
        load_run_config(None, ["deterministic=true", "rollout.top_p=0.9"])


@pytest.mark.parametrize(
    ("loss", "recompute", "forwards"),
    [
        (LossConfig(name="ppo"), False, 0),  # off by default: no step-start forward at all
        (LossConfig(name="ppo"), True, 1),  # the switch's own forward
        (LossConfig(name="decoupled_ppo"), False, 1),  # the recompute proximal's forward ...
        (LossConfig(name="decoupled_ppo"), True, 1),  # ... which the switch reuses
    ],
)
def test_a_step_runs_at_most_one_step_start_forward_of_the_policy(loss, recompute, forwards):
    trainer = Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-2),
        loss,
        AdvantageConfig(name="grpo"),
        recompute_behaviour=recompute,
    )
    calls = []
    run = trainer._no_grad_outputs
    trainer._no_grad_outputs = lambda module, *args: calls.append(module) or run(module, *args)
    trainer.train_step(noisy(1), policy_version=0)
    assert sum(module is trainer.policy for module in calls) == forwards
