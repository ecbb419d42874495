"""Train–inference mismatch correction at token, sequence and geometric granularity."""

import math
from dataclasses import replace

import pytest
import torch
from loss_inputs import make_inputs, tensor

from asyncrl.config.algorithm import LossConfig, MismatchConfig
from asyncrl.trainer.losses import compute_policy_loss
from asyncrl.trainer.mismatch import compute_mismatch_correction

# π_train/π_infer per token: row 0 [2, 0.25, 1], row 1 [3, 1.5, padding]
RATIOS = [[2.0, 0.25, 1.0], [3.0, 1.5, 40.0]]
MASK = tensor([[1, 1, 1], [1, 1, 0]])
INFER = tensor([[-1.0, -2.0, -0.5], [-0.7, -1.1, -3.0]])
TRAIN = INFER + tensor([[math.log(r) for r in row] for row in RATIOS])


def correct(**kwargs):
    return compute_mismatch_correction(TRAIN, INFER, MASK, MismatchConfig(**kwargs))


def counted(tensor_bt):
    return [row[:n] for row, n in zip(tensor_bt.tolist(), (3, 2), strict=True)]


@pytest.mark.parametrize(
    ("granularity", "weights"),
    [
        ("token", [[1.8, 0.25, 1.0], [1.8, 1.5]]),
        ("sequence", [[0.5] * 3, [1.8] * 2]),  # products 0.5 and 4.5
        ("geometric", [[0.5 ** (1 / 3)] * 3, [1.8] * 2]),  # geometric means 0.794 and 2.121
    ],
)
def test_truncate_weights_at_each_granularity(granularity, weights):
    result = correct(granularity=granularity, mode="truncate", cap=1.8)
    for actual, expected in zip(counted(result.weights), weights, strict=True):
        assert actual == pytest.approx(expected)
    assert torch.equal(result.mask, torch.ones_like(MASK))
    assert result.metrics["mismatch/masked_fraction"] == 0.0


@pytest.mark.parametrize(
    ("granularity", "low", "high", "keep", "weights"),
    [
        ("token", 0.3, 2.5, [[1, 0, 1], [0, 1]], [[2.0, 0.0, 1.0], [0.0, 1.5]]),
        ("sequence", 0.4, 2.5, [[1, 1, 1], [0, 0]], [[0.5] * 3, [0.0, 0.0]]),
        ("geometric", 0.5, 2.0, [[1, 1, 1], [0, 0]], [[0.5 ** (1 / 3)] * 3, [0.0, 0.0]]),
    ],
)
def test_mask_drops_units_outside_the_range(granularity, low, high, keep, weights):
    result = correct(granularity=granularity, mode="mask", low=low, high=high)
    assert counted(result.mask) == keep
    for actual, expected in zip(counted(result.weights), weights, strict=True):
        assert actual == pytest.approx(expected)
    assert result.metrics["mismatch/masked_fraction"] == pytest.approx(2 / 5)


def test_mismatch_metrics_kl_and_quantiles():
    metrics = correct(granularity="token", mode="truncate", cap=1.8).metrics
    assert metrics["mismatch/kl_k1"] == pytest.approx(-math.log(2.25) / 5)
    assert metrics["mismatch/kl_k3"] == pytest.approx((2.75 - math.log(2.25)) / 5)
    assert metrics["mismatch/ratio_min"] == pytest.approx(0.25)
    assert metrics["mismatch/ratio_p05"] == pytest.approx(0.4)  # linear interpolation in [0.25, 1, 1.5, 2, 3]
    assert metrics["mismatch/ratio_p50"] == pytest.approx(1.5)
    assert metrics["mismatch/ratio_p95"] == pytest.approx(2.8)
    assert metrics["mismatch/ratio_max"] == pytest.approx(3.0)
    assert metrics["mismatch/truncated_fraction"] == pytest.approx(2 / 5)


def test_sequence_metrics_use_one_ratio_per_sequence():
    metrics = correct(granularity="sequence", mode="truncate", cap=1.8).metrics
    assert (metrics["mismatch/ratio_min"], metrics["mismatch/ratio_max"]) == pytest.approx((0.5, 4.5))
    assert metrics["mismatch/truncated_fraction"] == pytest.approx(1 / 2)


def test_weights_carry_no_gradient():
    train = TRAIN.clone().requires_grad_(True)
    result = compute_mismatch_correction(train, INFER, MASK, MismatchConfig())
    assert not result.weights.requires_grad


def test_loss_uses_train_logprobs_as_old_policy_and_folds_in_weights():
    # engine log-probs are 0.5× the behaviour in probability: π_train/π_infer = 2 everywhere, capped at 1.5
    inputs = make_inputs(logprobs=[[-1.0, -2.0]], ratios=[[1.0, 1.0]], advantages=[[1.0, 1.0]])
    train_behaviour = inputs.behaviour_logprobs
    engine = train_behaviour - math.log(2.0)
    inputs = replace(inputs, behaviour_logprobs=engine, train_behaviour_logprobs=train_behaviour)
    config = LossConfig(name="tis", mismatch=MismatchConfig(cap=1.5))
    loss, metrics = compute_policy_loss("tis", inputs, config)
    loss.backward()
    # TIS ratio π_θ/π_train_old = 1 → objective 1.5·1·log π
    assert loss.item() == pytest.approx(1.5 * 3.0 / 2)
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([-0.75, -0.75])
    assert metrics["ratio_max"] == pytest.approx(1.0)
    assert metrics["mismatch/ratio_p50"] == pytest.approx(2.0)


def test_mask_mode_removes_tokens_from_the_loss_denominator():
    inputs = make_inputs(logprobs=[[-1.0, -2.0]], ratios=[[1.0, 1.0]], advantages=[[1.0, 1.0]])
    engine = inputs.behaviour_logprobs - tensor([[0.0, math.log(10.0)]])  # token 1: ratio 10, dropped
    inputs = replace(inputs, behaviour_logprobs=engine, train_behaviour_logprobs=inputs.behaviour_logprobs)
    config = LossConfig(name="reinforce", mismatch=MismatchConfig(mode="mask"))
    loss, metrics = compute_policy_loss("reinforce", inputs, config)
    assert loss.item() == pytest.approx(1.0)  # only token 0: −1·1·(−1)
    assert metrics["mismatch/masked_fraction"] == pytest.approx(0.5)


def test_mismatch_requires_train_behaviour_logprobs():
    inputs = make_inputs(logprobs=[[-1.0]], ratios=[[1.0]], advantages=[[1.0]])
    with pytest.raises(ValueError, match="train_behaviour_logprobs"):
        compute_policy_loss("ppo", inputs, LossConfig(mismatch=MismatchConfig()))
