"""Every registered loss against hand-computed values and gradients (loss = −objective, token-mean)."""

import math
from dataclasses import replace

import pytest
import torch
from loss_inputs import make_inputs, tensor

from asyncrl.config.algorithm import (
    CISPOParams,
    ClipParams,
    DecoupledPPOParams,
    KLConfig,
    LossConfig,
    TISParams,
    TOPRParams,
)
from asyncrl.trainer.losses import compute_policy_loss
from asyncrl.trainer.losses.decoupled_ppo import loglinear_proximal_logprobs


def run(inputs, config):
    loss, metrics = compute_policy_loss(config.name, inputs, config)
    loss.backward()
    return loss.item(), inputs.logprobs.grad.tolist(), metrics


def assert_close(actual, expected):
    assert torch.tensor(actual, dtype=torch.float64) == pytest.approx(
        torch.tensor(expected, dtype=torch.float64)
    )


def ppo_inputs():
    """Row 0: clipped high, clipped low, unclipped. Row 1: unclipped (A<0), clipped high, padding."""
    return make_inputs(
        logprobs=[[-1.0, -0.5, -2.0], [-0.3, -1.2, -9.0]],
        ratios=[[1.5, 0.5, 1.1], [0.9, 1.3, 7.0]],
        advantages=[[1.0, -1.0, 1.0], [-2.0, 2.0, 5.0]],
        mask=[[1, 1, 1], [1, 1, 0]],
    )


def test_ppo_clipped_objective_gradient_and_metrics():
    loss, grad, metrics = run(ppo_inputs(), LossConfig(name="ppo"))
    # objective: 1.2 (clip) - 0.8 (clip) + 1.1 - 1.8 + 2.4 (clip) over 5 tokens
    assert loss == pytest.approx(-2.1 / 5)
    assert_close(grad, [[0.0, 0.0, -1.1 / 5], [1.8 / 5, 0.0, 0.0]])
    assert metrics["clip_fraction_low"] == pytest.approx(1 / 5)
    assert metrics["clip_fraction_high"] == pytest.approx(2 / 5)
    assert metrics["clip_fraction"] == pytest.approx(3 / 5)
    assert (metrics["ratio_min"], metrics["ratio_max"]) == pytest.approx((0.5, 1.5))
    assert metrics["ratio_mean"] == pytest.approx(5.3 / 5)
    assert metrics["masked_fraction"] == pytest.approx(1 / 6)
    assert metrics["policy_loss"] == pytest.approx(loss)


def test_ppo_asymmetric_clip_higher():
    inputs = make_inputs(logprobs=[[-1.0]], ratios=[[1.25]], advantages=[[1.0]])
    loss, grad, metrics = run(inputs, LossConfig(name="ppo", ppo=ClipParams(eps_low=0.2, eps_high=0.28)))
    assert loss == pytest.approx(-1.25)
    assert_close(grad, [[-1.25]])
    assert metrics["clip_fraction"] == 0.0


def test_ppo_dual_clip_bounds_negative_advantage_loss():
    inputs = make_inputs(logprobs=[[-1.0, -1.0]], ratios=[[4.0, 2.0]], advantages=[[-1.0, -1.0]])
    loss, grad, metrics = run(inputs, LossConfig(name="ppo", ppo=ClipParams(dual_clip=3.0)))
    # token 0: min(-4, -1.2) = -4, dual-clipped to -3 (no gradient); token 1: -2, gradient r·A = -2
    assert loss == pytest.approx(2.5)
    assert_close(grad, [[0.0, 1.0]])
    assert metrics["dual_clip_fraction"] == pytest.approx(0.5)


def test_grpo_adds_beta_times_kl_to_the_ppo_objective():
    inputs = ppo_inputs()
    ref = inputs.logprobs.detach() - 0.1  # k1 = log π_θ − log π_ref = 0.1 on every token
    inputs = make_inputs(
        logprobs=inputs.logprobs.tolist(),
        ratios=[[1.5, 0.5, 1.1], [0.9, 1.3, 7.0]],
        advantages=inputs.advantages.tolist(),
        mask=inputs.loss_mask.tolist(),
        ref_logprobs=ref,
    )
    loss, grad, metrics = run(inputs, LossConfig(name="grpo", kl=KLConfig(beta=0.1, estimator="k1")))
    assert loss == pytest.approx(-2.1 / 5 + 0.01)
    assert_close(grad, [[0.02, 0.02, -1.1 / 5 + 0.02], [1.8 / 5 + 0.02, 0.02, 0.0]])
    assert metrics["kl"] == pytest.approx(0.1)


def test_kl_penalty_requires_reference_logprobs():
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss("grpo", ppo_inputs(), LossConfig(name="grpo", kl=KLConfig(beta=0.1)))


def decoupled_inputs(**extra):
    """ρ = π_θ/π_prox = [1.5, 1.1, 0.7, 0.9] and w = π_prox/π_old = [0.5, 2, 1.5, 0.8]."""
    rho, weight = [1.5, 1.1, 0.7, 0.9], [0.5, 2.0, 1.5, 0.8]
    logprobs = [[-1.0, -0.4, -2.0, -0.6]]
    proximal = tensor(logprobs) - tensor([[math.log(r) for r in rho]])
    return make_inputs(
        logprobs=logprobs,
        ratios=[[r * w for r, w in zip(rho, weight, strict=True)]],
        advantages=[[1.0, 1.0, -1.0, -1.0]],
        proximal_logprobs=proximal.requires_grad_(True),
        **extra,
    )


def test_decoupled_ppo_recompute_value_gradient_and_metrics():
    inputs = decoupled_inputs()
    loss, grad, metrics = run(inputs, LossConfig(name="decoupled_ppo"))
    # w·min(ρA, clip(ρ)A): 0.5·1.2 (clip), 2·1.1, 1.5·(−0.8) (clip), 0.8·(−0.9)
    assert loss == pytest.approx(-(0.6 + 2.2 - 1.2 - 0.72) / 4)
    assert_close(grad, [[0.0, -2.2 / 4, 0.0, 0.72 / 4]])
    assert inputs.proximal_logprobs.grad is None  # π_prox is a constant
    assert metrics["clip_fraction_low"] == pytest.approx(0.25)
    assert metrics["clip_fraction_high"] == pytest.approx(0.25)
    assert (metrics["behaviour_weight_min"], metrics["behaviour_weight_max"]) == pytest.approx((0.5, 2.0))
    assert (metrics["proximal_ratio_min"], metrics["proximal_ratio_max"]) == pytest.approx((0.7, 1.5))
    assert metrics["ratio_max"] == pytest.approx(2.2)


def test_decoupled_ppo_equals_the_min_form_of_its_definition():
    inputs = decoupled_inputs()
    loss, _ = compute_policy_loss("decoupled_ppo", inputs, LossConfig(name="decoupled_ppo"))
    lp, old, prox, adv = (
        inputs.logprobs,
        inputs.behaviour_logprobs,
        inputs.proximal_logprobs,
        inputs.advantages,
    )
    r, w, rho = torch.exp(lp - old), torch.exp(prox - old), torch.exp(lp - prox)
    reference = -torch.minimum(r * adv, w * rho.clamp(0.8, 1.2) * adv).mean()
    assert loss.item() == pytest.approx(reference.item())


def test_loglinear_proximal_interpolates_by_version():
    logprobs, behaviour = tensor([[-1.0, -1.0, -1.0]]), tensor([[-2.0, -2.0, -2.0]])
    versions = torch.tensor([[5, 4, 3]])
    proximal = loglinear_proximal_logprobs(logprobs, behaviour, versions, current_version=5)
    assert_close(proximal.tolist(), [[-2.0, -1.5, -2.0 + 2 / 3]])


def test_decoupled_ppo_loglinear_value_and_gradient():
    # log r = [ln 1.1, 2 ln 1.1, 3 ln 1.5] at staleness 0, 1, 2 → ρ = [1.1, 1.1, 1.5], w = [1, 1.1, 2.25]
    inputs = make_inputs(
        logprobs=[[-1.0, -0.5, -0.2]],
        ratios=[[1.1, 1.21, 3.375]],
        advantages=[[1.0, 1.0, 1.0]],
        token_versions=torch.tensor([[5, 4, 3]]),
        current_version=5,
    )
    config = LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="loglinear"))
    loss, grad, metrics = run(inputs, config)
    assert loss == pytest.approx(-(1.1 + 1.21 + 2.25 * 1.2) / 3)
    assert_close(grad, [[-1.1 / 3, -1.21 / 3, 0.0]])
    assert metrics["clip_fraction_high"] == pytest.approx(1 / 3)


def test_decoupled_ppo_names_missing_inputs_and_future_tokens():
    inputs = make_inputs(logprobs=[[-1.0]], ratios=[[1.0]], advantages=[[1.0]])
    with pytest.raises(ValueError, match="proximal_logprobs"):
        compute_policy_loss("decoupled_ppo", inputs, LossConfig(name="decoupled_ppo"))
    loglinear = LossConfig(name="decoupled_ppo", decoupled_ppo=DecoupledPPOParams(proximal="loglinear"))
    with pytest.raises(ValueError, match="token_versions"):
        compute_policy_loss("decoupled_ppo", inputs, loglinear)
    future = make_inputs(
        logprobs=[[-1.0]],
        ratios=[[1.0]],
        advantages=[[1.0]],
        token_versions=torch.tensor([[3]]),
        current_version=2,
    )
    with pytest.raises(ValueError, match="future"):
        compute_policy_loss("decoupled_ppo", future, loglinear)


def is_inputs():
    return make_inputs(logprobs=[[-1.0, -2.0, -0.5]], ratios=[[3.0, 0.5, 1.1]], advantages=[[1.0, -1.0, 2.0]])


def test_tis_truncates_the_detached_ratio():
    inputs = make_inputs(
        logprobs=[[-1.0, -2.0, -0.5]], ratios=[[3.0, 0.5, 1.5]], advantages=[[1.0, -1.0, 2.0]]
    )
    loss, grad, metrics = run(inputs, LossConfig(name="tis", tis=TISParams(cap=2.0)))
    # sg(min(r, 2))·A·log π: 2·1·(−1) + 0.5·(−1)·(−2) + 1.5·2·(−0.5) = −2.5
    assert loss == pytest.approx(2.5 / 3)
    assert_close(grad, [[-2 / 3, 0.5 / 3, -3 / 3]])
    assert metrics["clip_fraction_high"] == pytest.approx(1 / 3)
    assert metrics["clip_fraction_low"] == 0.0
    assert metrics["is_weight_max"] == pytest.approx(2.0)


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    loss, grad, metrics = run(
        is_inputs(), LossConfig(name="cispo", cispo=CISPOParams(eps_low=0.2, eps_high=0.28))
    )
    # weights clip(r, 0.8, 1.28) = [1.28, 0.8, 1.1]; objective [−1.28, 1.6, −1.1]
    assert loss == pytest.approx(0.78 / 3)
    assert_close(grad, [[-1.28 / 3, 0.8 / 3, -2.2 / 3]])
    assert metrics["clip_fraction_low"] == pytest.approx(1 / 3)
    assert metrics["clip_fraction_high"] == pytest.approx(1 / 3)


def test_weighted_topr_truncates_only_negative_trajectories():
    inputs = make_inputs(
        logprobs=[[-1.0, -2.0], [-1.0, -2.0]],
        ratios=[[3.0, 0.5], [3.0, 0.5]],
        advantages=[[1.0, 1.0], [-1.0, -1.0]],
        sequence_rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
    )
    params = TOPRParams(cap=1.0, positive_weight=2.0, negative_weight=0.5)
    loss, grad, metrics = run(inputs, LossConfig(name="topr", topr=params))
    # positive row: weight 2 → [−2, −4]; negative row: 0.5·min(r, 1) = [0.5, 0.25] → [0.5, 0.5]
    assert loss == pytest.approx(5 / 4)
    assert_close(grad, [[-0.5, -0.5], [0.125, 0.0625]])
    assert metrics["clip_fraction_high"] == pytest.approx(1 / 4)
    assert metrics["positive_sequence_fraction"] == pytest.approx(0.5)
    assert metrics["positive_token_fraction"] == pytest.approx(0.5)


def test_topr_requires_sequence_rewards():
    with pytest.raises(ValueError, match="sequence_rewards"):
        compute_policy_loss("topr", is_inputs(), LossConfig(name="topr"))


def test_reinforce_is_the_plain_log_likelihood_gradient():
    loss, grad, metrics = run(is_inputs(), LossConfig(name="reinforce"))
    assert loss == pytest.approx(0.0)  # objective −1 + 2 − 1
    assert_close(grad, [[-1 / 3, 1 / 3, -2 / 3]])
    assert metrics["clip_fraction"] == 0.0
    assert metrics["ratio_max"] == pytest.approx(3.0)


ALL_CONFIGS = [
    LossConfig(name="ppo", ppo=ClipParams(dual_clip=3.0)),
    LossConfig(name="grpo", kl=KLConfig(beta=0.1)),
    LossConfig(name="decoupled_ppo"),
    LossConfig(name="tis"),
    LossConfig(name="cispo"),
    LossConfig(name="topr"),
    LossConfig(name="reinforce"),
]


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize(
    "aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_every_loss_and_aggregation_ignores_masked_tokens(config, aggregation):
    config = replace(config, aggregation=aggregation)

    def inputs_with_padding(pad_value):
        return make_inputs(
            logprobs=[[-1.0, -0.5, pad_value], [-0.3, -1.2, pad_value]],
            ratios=[[1.5, 0.5, 9.0], [0.9, 1.3, 9.0]],
            advantages=[[1.0, 1.0, pad_value], [-2.0, -2.0, pad_value]],
            mask=[[1, 1, 0], [1, 1, 0]],
            proximal_logprobs=tensor([[-1.1, -0.4, pad_value], [-0.2, -1.0, pad_value]]),
            ref_logprobs=tensor([[-1.2, -0.6, pad_value], [-0.4, -1.0, pad_value]]),
            sequence_rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        )

    clean_loss, clean_grad, _ = run(inputs_with_padding(-3.0), config)
    noisy_loss, noisy_grad, _ = run(inputs_with_padding(-50.0), config)
    assert noisy_loss == pytest.approx(clean_loss)
    assert_close(noisy_grad, clean_grad)
    assert clean_grad[0][2] == 0.0 and clean_grad[1][2] == 0.0


def test_compute_policy_loss_rejects_unknown_or_mismatched_names():
    with pytest.raises(ValueError, match="cispo, decoupled_ppo"):
        compute_policy_loss("a2c", is_inputs(), LossConfig())
    with pytest.raises(ValueError, match="loss.name is 'ppo'"):
        compute_policy_loss("tis", is_inputs(), LossConfig(name="ppo"))


COMMON_METRICS = {
    "clip_fraction_low",
    "clip_fraction_high",
    "clip_fraction",
    "ratio_min",
    "ratio_mean",
    "ratio_max",
    "masked_fraction",
    "policy_loss",
}


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.name)
def test_every_loss_reports_the_common_metrics(config):
    inputs = make_inputs(
        logprobs=[[-1.0, -0.5]],
        ratios=[[1.5, 0.5]],
        advantages=[[1.0, -1.0]],
        proximal_logprobs=tensor([[-1.1, -0.4]]),
        ref_logprobs=tensor([[-1.2, -0.6]]),
        sequence_rewards=torch.tensor([1.0], dtype=torch.float64),
    )
    _, metrics = compute_policy_loss(config.name, inputs, config)
    assert set(metrics) >= COMMON_METRICS
    assert "kl" in metrics
    assert all(isinstance(value, float) for value in metrics.values())


@pytest.mark.parametrize(
    ("aggregation", "norm_length", "expected"),
    [
        ("token-mean", None, -(-1.0 + 2.0 - 2.0 + 3.0) / 4),  # objective A·log π: [−1, 2, −2] and [3]
        ("seq-mean-token-mean", None, -(-1.0 / 3 + 3.0) / 2),
        ("seq-mean-token-sum", None, -(-1.0 + 3.0) / 2),
        ("seq-mean-token-sum-norm", 4, -(-1.0 + 3.0) / 2 / 4),
    ],
)
def test_aggregation_modes_through_compute_policy_loss(aggregation, norm_length, expected):
    inputs = make_inputs(
        logprobs=[[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]],
        ratios=[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]],
        advantages=[[1.0, -1.0, 4.0], [-1.0, 7.0, 7.0]],
        mask=[[1, 1, 1], [1, 0, 0]],
    )
    config = LossConfig(name="reinforce", aggregation=aggregation, norm_length=norm_length)
    loss, _ = compute_policy_loss("reinforce", inputs, config)
    assert loss.item() == pytest.approx(expected)
