"""PPO with a critic: values and GAE from the trained critic at train time, the clipped value loss, warm-up,
checkpoint and exact resume, and only the policy offered to the engines — for both critic types."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.critic import CriticConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.gradients import stepped_gradients
from asyncrl.trainer.batching import select_rows
from asyncrl.trainer.checkpoint import load_checkpoint, save_checkpoint
from asyncrl.trainer.gae import gae
from asyncrl.trainer.losses.value import value_loss
from asyncrl.trainer.trainer import Trainer

TYPES = ["separate", "shared_trunk"]


def make_trainer(kind: str, **critic: object) -> Trainer:
    config = TrainerConfig(lr=1e-3, num_mini_batches=2, ppo_epochs=2, max_tokens_per_microbatch=40)
    return Trainer(
        tiny_qwen2(),
        config,
        LossConfig(),
        AdvantageConfig(name="gae", lam=0.9, whiten=False),
        critic=CriticConfig(type=kind, **critic),
    )


def groups(seed: int = 0):
    return with_model_logprobs(random_groups(seed=seed), tiny_qwen2(), noise=0.1, seed=seed)


def critic_values(trainer: Trainer, batch) -> torch.Tensor:
    """The trained critic's values of ``batch``, computed here from its current weights."""
    with torch.no_grad():
        if trainer.critic.shared:
            return trainer.policy(batch.input_ids, batch.attention_mask, batch.loss_mask).values
        return trainer.critic.module(batch.input_ids, batch.attention_mask, batch.loss_mask)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[name], tensor) for name, tensor in module.state_dict().items())


@pytest.mark.parametrize("kind", TYPES)
def test_values_and_advantages_come_from_the_trained_critic_at_train_time(kind):
    """Step 2's GAE reads the values of the critic as step 1 left it (no values from rollout time)."""
    trainer = make_trainer(kind)
    trainer.train_step(groups(0), 0)
    second = groups(1)
    batch = trainer.make_batch(second)
    values = critic_values(trainer, batch)
    assert float(values.abs().sum()) > 0  # the zero head has learned: the check can fail
    advantages, returns = gae(batch.token_rewards, values, batch.loss_mask, 1.0, 0.9)
    metrics = trainer.train_step(second, 1)
    count = batch.loss_mask.sum()
    assert metrics["critic/values_mean"] == pytest.approx(
        float((values * batch.loss_mask).sum() / count), rel=1e-5
    )
    assert metrics["critic/returns_mean"] == pytest.approx(float(returns.sum() / count), rel=1e-5)
    assert metrics["critic/advantages_mean"] == pytest.approx(float(advantages.sum() / count), rel=1e-5)


@pytest.mark.parametrize("kind", TYPES)
def test_a_step_trains_policy_and_critic_and_the_engines_get_only_the_policy(kind):
    trainer = make_trainer(kind)
    policy, critic = snapshot(trainer.model), snapshot(trainer.critic.module)
    metrics = trainer.train_step(groups(), 0)
    assert changed(policy, trainer.model) and changed(critic, trainer.critic.module)
    assert metrics["critic/value_loss"] > 0 and metrics["critic/grad_norm"] > 0
    offered = trainer.state_for_sync()
    assert set(offered) == set(tiny_qwen2().state_dict()) | {"lm_head.weight"}
    critic_tensors = {t.data_ptr() for t in trainer.critic.module.parameters()}
    assert not critic_tensors & {t.data_ptr() for t in trainer.model.parameters()} or kind == "shared_trunk"


@pytest.mark.parametrize("kind", TYPES)
def test_warmup_trains_only_the_critic_while_versions_advance(kind):
    trainer = make_trainer(kind, warmup_steps=2)
    policy = snapshot(trainer.model)
    for step in range(2):
        critic = snapshot(trainer.critic.module)
        metrics = trainer.train_step(groups(step), step)
        assert not changed(policy, trainer.model), f"policy moved in warm-up step {step}"
        assert changed(critic, trainer.critic.module)
        assert metrics["critic/warmup"] == 1.0 and metrics["loss"] == 0.0
    assert trainer.version == 2
    metrics = trainer.train_step(groups(2), 2)
    assert changed(policy, trainer.model) and metrics["critic/warmup"] == 0.0


@pytest.mark.parametrize("kind", TYPES)
def test_a_resumed_critic_run_continues_exactly(kind, tmp_path):
    """Two steps, a checkpoint, a fresh trainer loading it: the third step gives the uninterrupted weights."""
    straight = make_trainer(kind)
    for step in range(2):
        straight.train_step(groups(step), step)
    path = save_checkpoint(tmp_path, straight, extra={})
    straight.train_step(groups(2), 2)

    resumed = make_trainer(kind)
    load_checkpoint(path, resumed)
    assert (resumed.step, resumed.version) == (2, 2)
    resumed.train_step(groups(2), 2)
    for got, want in ((resumed.model, straight.model), (resumed.critic.module, straight.critic.module)):
        for name, tensor in want.state_dict().items():
            assert torch.equal(got.state_dict()[name], tensor), name


def test_a_checkpoint_without_a_critic_is_refused_by_a_critic_run(tmp_path):
    plain = Trainer(tiny_qwen2(), TrainerConfig(), LossConfig(), AdvantageConfig())
    path = save_checkpoint(tmp_path, plain, extra={})
    with pytest.raises(ValueError, match="disagree on the critic"):
        load_checkpoint(path, make_trainer("separate"))


def test_a_separate_critic_may_start_from_another_body():
    body = copy.deepcopy(tiny_qwen2(seed=5).model)
    trainer = Trainer(
        tiny_qwen2(),
        TrainerConfig(),
        LossConfig(),
        AdvantageConfig(name="gae"),
        critic=CriticConfig(),
        critic_body=body,
    )
    assert trainer.critic.module.body is body


def test_micro_batches_accumulate_the_whole_batch_value_gradient():
    """The value loss accumulates over micro-batches like the policy loss: one budget or many, same gradient (one
    optimizer step per train step here: its gradients, read before the trainer frees them)."""
    batch_groups = groups()
    grads = []
    for budget in (10_000, 24):
        config = TrainerConfig(lr=1e-3, max_tokens_per_microbatch=budget, sequence_packing=False)
        trainer = Trainer(
            tiny_qwen2(),
            config,
            LossConfig(),
            AdvantageConfig(name="gae"),
            critic=CriticConfig(warmup_steps=1),
        )
        with torch.no_grad():  # a non-zero head, so the body's gradient is not zero
            trainer.critic.module.head.weight.normal_(generator=torch.Generator().manual_seed(0))
        with stepped_gradients(trainer) as stepped:
            trainer.train_step(batch_groups, 0)
        grads.append({n: g for n, g in stepped[-1].items() if n.startswith("critic.")})
    assert len(trainer._plan_micro_batches(select_rows(trainer.make_batch(batch_groups), range(12)))) > 1
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, rtol=1e-4, atol=1e-6), name


def test_clipped_value_loss_matches_the_formula():
    values = torch.tensor([[0.0, 1.0, 0.5, -0.4]], requires_grad=True)
    old = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 2.0, 0.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    loss, metrics = value_loss(values, old, returns, mask, clip=0.2, aggregation="token-mean")
    # token 1: V moved 0.5 > 0.2 → clipped 0.7: max(1.0², 1.3²)/2; token 2: max(0.25, 0.25)/2; token 3: V moved
    # −0.4 → clipped −0.2: max(1.4², 1.2²)/2 (the unclipped term wins)
    expected = (1.3**2 + 0.5**2 + 1.4**2) / 2 / 3
    assert loss.item() == pytest.approx(expected)
    assert metrics["critic/value_clip_fraction"] == pytest.approx(1 / 3)
    unclipped, _ = value_loss(values, old, returns, mask, clip=None, aggregation="token-mean")
    assert unclipped.item() == pytest.approx((1.0 + 0.25 + 1.96) / 2 / 3)


@pytest.mark.parametrize("kind", TYPES)
def test_a_critic_beside_lora_trains_and_the_engines_still_get_adapters_only(kind):
    """With LoRA the policy trains adapters; a separate critic is a full-weight copy of the base taken before
    the adapters were attached, a shared head sits on the adapted trunk. Weight sync stays adapter-only."""
    from asyncrl.config.trainer import LoraConfig

    config = TrainerConfig(lr=1e-3, lora=LoraConfig(rank=4, alpha=8.0))
    trainer = Trainer(
        tiny_qwen2(), config, LossConfig(), AdvantageConfig(name="gae"), critic=CriticConfig(type=kind)
    )
    if kind == "separate":
        assert not any("lora_" in name for name, _ in trainer.critic.module.named_parameters())
        assert all(p.requires_grad for p in trainer.critic.module.parameters())
    critic = snapshot(trainer.critic.module)
    trainer.train_step(groups(), 0)
    assert changed(critic, trainer.critic.module)
    assert trainer.adapter is not None and all("lora_" in name for name in trainer.sync_tensors())
