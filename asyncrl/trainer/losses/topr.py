"""(Weighted) TOPR, Tapered Off-Policy REINFORCE (Roux et al. 2025).

Positive trajectories (sequence reward > threshold) are reinforced at full strength, w₊·A·log π_θ; negative
ones are pushed down only as much as truncated IS allows, w₋·sg(min(r, c))·A·log π_θ. Pushing down a
trajectory the current policy already finds unlikely is what destabilises off-policy REINFORCE; the
truncation tapers exactly that, while good trajectories keep their full signal.
"""

from __future__ import annotations

import torch

from asyncrl.config.algorithm import TOPRParams
from asyncrl.trainer.losses.base import (
    PolicyLossInputs,
    clip_metrics,
    masked_fraction_of,
    masked_stats,
    register_loss,
)
from asyncrl.trainer.losses.importance import detached_ratio


@register_loss("topr")
def topr_loss(inputs: PolicyLossInputs, params: TOPRParams) -> tuple[torch.Tensor, dict[str, float]]:
    """−(1[τ∈T⁺]·w₊ + 1[τ∈T⁻]·w₋·sg(min(r, c)))·A·log π_θ."""
    rewards = inputs.require("sequence_rewards", "loss 'topr'")
    positive = (rewards > params.reward_threshold).to(inputs.logprobs.dtype).unsqueeze(-1)  # [B, 1]
    ratio = detached_ratio(inputs)
    weight = positive * params.positive_weight + (1 - positive) * params.negative_weight * ratio.clamp(
        max=params.cap
    )
    mask = inputs.loss_mask
    truncated = (ratio > params.cap) & (positive == 0)
    metrics = clip_metrics(torch.zeros_like(truncated), truncated, mask)
    metrics |= masked_stats(ratio, mask, "ratio")
    metrics["positive_token_fraction"] = masked_fraction_of(positive.expand_as(mask) > 0, mask)
    metrics["positive_sequence_fraction"] = float(positive.mean())
    return -(weight * inputs.advantages * inputs.logprobs), metrics
