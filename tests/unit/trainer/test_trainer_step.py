"""Trainer.train_step on a tiny random Qwen2: accumulation equivalence, learning, versions, sync state."""

from __future__ import annotations

import copy

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, DecoupledPPOParams, KLConfig, LossConfig, MismatchConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.gradients import stepped_gradients
from asyncrl.trainer.distributed.normalisation import combine, global_accumulation_weight, local_denominator
from asyncrl.trainer.trainer import Trainer

LOSS_CONFIGS = {
    "token-mean": LossConfig(name="ppo", aggregation="token-mean"),
    "seq-mean-token-mean": LossConfig(name="ppo", aggregation="seq-mean-token-mean"),
    "seq-mean-token-sum": LossConfig(name="ppo", aggregation="seq-mean-token-sum"),
    "seq-mean-token-sum-norm": LossConfig(name="ppo", aggregation="seq-mean-token-sum-norm"),
    "sum-norm-fixed-length": LossConfig(name="ppo", aggregation="seq-mean-token-sum-norm", norm_length=16),
    "mismatch-mask": LossConfig(
        name="ppo", mismatch=MismatchConfig(granularity="token", mode="mask", low=0.8, high=1.25)
    ),
    "decoupled-recompute": LossConfig(
        name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="recompute")
    ),
    "grpo-kl": LossConfig(name="grpo", kl=KLConfig(beta=0.1, estimator="k3")),
}


def _trainer(loss_config: LossConfig, **config) -> Trainer:
    model = tiny_qwen2()
    ref = copy.deepcopy(model) if loss_config.needs_reference else None
    trainer_config = TrainerConfig(**{"lr": 1e-3, "max_grad_norm": None, **config})
    return Trainer(model, trainer_config, loss_config, AdvantageConfig(name="grpo"), ref_model=ref)


@pytest.mark.parametrize("case", list(LOSS_CONFIGS))
def test_micro_batch_accumulation_gives_the_whole_batch_gradient(case):
    loss_config = LOSS_CONFIGS[case]
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    whole = _trainer(loss_config, max_tokens_per_microbatch=10_000)
    split = _trainer(loss_config, max_tokens_per_microbatch=30)  # 3 to 4 micro-batches of unequal widths
    with stepped_gradients(whole) as whole_grads, stepped_gradients(split) as split_grads:
        whole_metrics = whole.train_step(groups, policy_version=0)
        split_metrics = split.train_step(groups, policy_version=0)
    assert split_metrics["loss"] == pytest.approx(whole_metrics["loss"], abs=1e-6)
    assert split_metrics["grad_norm"] == pytest.approx(whole_metrics["grad_norm"], rel=1e-5)
    assert split_metrics["entropy"] == pytest.approx(whole_metrics["entropy"], rel=1e-5)
    assert whole_grads[-1].keys() == split_grads[-1].keys() and whole_grads[-1]
    for name, grad in whole_grads[-1].items():
        assert torch.allclose(grad, split_grads[-1][name], atol=1e-6, rtol=1e-4), name


def test_repeated_steps_change_the_weights_and_lower_the_loss():
    model = tiny_qwen2()
    groups = with_model_logprobs(random_groups(seed=2), model)
    trainer = Trainer(
        model, TrainerConfig(lr=3e-3), LossConfig(name="reinforce"), AdvantageConfig(name="grpo")
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = [trainer.train_step(groups, policy_version=v)["loss"] for v in range(6)]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:], strict=False)), losses
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    assert (trainer.step, trainer.version) == (6, 6)


def test_metrics_version_and_schedule():
    groups = with_model_logprobs(random_groups(seed=3), tiny_qwen2())
    trainer = _trainer(LossConfig(name="ppo"), warmup_steps=1, max_grad_norm=1.0)
    first = trainer.train_step(groups, policy_version=0)
    second = trainer.train_step(groups, policy_version=1)
    assert (first["lr"], second["lr"]) == pytest.approx((5e-4, 1e-3))
    assert (first["version"], second["version"]) == (1.0, 2.0)
    total_tokens = sum(len(t.token_ids) for g in groups for t in g.trajectories)
    trained_tokens = sum(t.num_response_tokens for g in groups for t in g.trajectories)
    assert (first["num_tokens"], first["num_trained_tokens"], first["num_samples"]) == (
        total_tokens,
        trained_tokens,
        12,
    )
    assert {"loss", "entropy", "grad_norm", "train_time_s", "train_tokens_per_s", "clip_fraction"} <= set(
        first
    )
    with pytest.raises(ValueError, match="policy_version 0, but the trainer is at 2"):
        trainer.train_step(groups, policy_version=0)


def test_each_epoch_and_mini_batch_is_one_optimizer_step():
    groups = with_model_logprobs(random_groups(seed=4), tiny_qwen2())
    trainer = _trainer(LossConfig(name="ppo"), ppo_epochs=2, num_mini_batches=3)
    trainer.train_step(groups, policy_version=0)
    steps = {float(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {6.0}


def test_reference_kl_is_zero_at_the_start_and_required_when_beta_is_positive():
    groups = with_model_logprobs(random_groups(seed=5), tiny_qwen2())
    trainer = _trainer(LOSS_CONFIGS["grpo-kl"])
    assert trainer.train_step(groups, policy_version=0)["kl"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="needs a reference model"):
        Trainer(tiny_qwen2(), TrainerConfig(), LOSS_CONFIGS["grpo-kl"], AdvantageConfig())


def test_state_for_sync_is_a_snapshot_with_the_output_layer():
    trainer = _trainer(LossConfig(name="ppo"))
    state = trainer.state_for_sync()
    embed = trainer.model.get_input_embeddings().weight
    assert torch.equal(state["lm_head.weight"], embed)
    assert state["lm_head.weight"].data_ptr() != embed.data_ptr()
    assert set(state) >= {name for name, _ in trainer.model.named_parameters()}


def test_samples_without_response_tokens_are_carried_but_not_trained():
    groups = random_groups(num_groups=2, seed=6)
    for trajectory in groups[1].trajectories:  # a whole group whose responses were empty
        n = trajectory.num_prompt_tokens
        trajectory.token_ids, trajectory.loss_mask = trajectory.token_ids[:n], trajectory.loss_mask[:n]
        trajectory.logprobs, trajectory.versions = trajectory.logprobs[:n], trajectory.versions[:n]
    groups = with_model_logprobs(groups, tiny_qwen2())
    trainer = _trainer(LossConfig(name="ppo"), max_tokens_per_microbatch=8)
    metrics = trainer.train_step(groups, policy_version=0)
    assert metrics["num_trained_tokens"] == sum(t.num_response_tokens for t in groups[0].trajectories)


def test_a_micro_batch_without_counted_tokens_adds_no_ratio_statistics():
    """Ratio statistics are those of the trained tokens: a micro-batch of empty responses used to report
    ratio_min = 0, which the merge kept. The empty group changes no other row's ratio or advantage."""
    groups = random_groups(num_groups=2, seed=6)
    for trajectory in groups[1].trajectories:
        n = trajectory.num_prompt_tokens
        trajectory.token_ids, trajectory.loss_mask = trajectory.token_ids[:n], trajectory.loss_mask[:n]
        trajectory.logprobs, trajectory.versions = trajectory.logprobs[:n], trajectory.versions[:n]
    groups = with_model_logprobs(groups, tiny_qwen2(), noise=0.5)
    got = _trainer(LossConfig(name="ppo"), max_tokens_per_microbatch=8).train_step(groups, policy_version=0)
    want = _trainer(LossConfig(name="ppo"), max_tokens_per_microbatch=8).train_step(groups[:1], 0)
    for key in ("ratio_min", "ratio_mean", "ratio_max"):
        assert got[key] == pytest.approx(want[key], rel=1e-6), key
    assert got["ratio_min"] < 1 < got["ratio_max"]  # the noise moved them: the check can fail


def test_bfloat16_autocast_trains():
    groups = with_model_logprobs(random_groups(num_groups=2, seed=7), tiny_qwen2())
    trainer = _trainer(LossConfig(name="ppo"), compute_dtype="bfloat16")
    before = trainer.model.model.embed_tokens.weight.detach().clone()
    metrics = trainer.train_step(groups, policy_version=0)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    assert not torch.equal(before, trainer.model.model.embed_tokens.weight)
    assert trainer.model.model.embed_tokens.weight.dtype == torch.float32


def test_accumulation_weight_is_the_share_of_the_aggregation_denominator():
    mini = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    micro = mini[:3, :3]  # 4 of the 8 masked tokens, 2 of the 3 non-empty sequences, width 3 of 4
    total = combine([local_denominator(mini)])  # one rank: the mini-batch is the whole
    weight = {
        mode: global_accumulation_weight(LossConfig(name="ppo", aggregation=mode), micro, total, 1)
        for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
    }
    assert weight == {
        "token-mean": 0.5,
        "seq-mean-token-mean": pytest.approx(2 / 3),
        "seq-mean-token-sum": pytest.approx(2 / 3),
        "seq-mean-token-sum-norm": pytest.approx(2 / 3 * 3 / 4),
    }
    fixed = LossConfig(name="ppo", aggregation="seq-mean-token-sum-norm", norm_length=10)
    assert global_accumulation_weight(fixed, micro, total, 1) == pytest.approx(2 / 3)


def test_activation_checkpointing_gives_the_same_gradients_with_dropout_still_off():
    loss_config = LOSS_CONFIGS["token-mean"]
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    plain = _trainer(loss_config)
    checkpointed = _trainer(loss_config, activation_checkpointing=True)
    assert not any(m.training for m in checkpointed.model.modules() if isinstance(m, torch.nn.Dropout))
    with stepped_gradients(plain) as plain_grads, stepped_gradients(checkpointed) as checkpointed_grads:
        plain.train_step(groups, policy_version=0)
        checkpointed.train_step(groups, policy_version=0)
    assert plain_grads[-1].keys() == checkpointed_grads[-1].keys() and plain_grads[-1]
    for name, grad in plain_grads[-1].items():
        assert torch.allclose(grad, checkpointed_grads[-1][name], atol=1e-7, rtol=1e-5), name
