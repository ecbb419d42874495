"""Importance-sampling losses that keep every token's gradient: truncated IS and CISPO.

Both are objective = sg(w)·A·log π_θ with w a bounded function of r = π_θ/π_old, so the gradient is that of a
weighted log-likelihood: w·A·∇log π_θ, never zeroed the way PPO's clipped tokens are.
"""

from __future__ import annotations

import torch

from asyncrl.config.algorithm import CISPOParams, TISParams
from asyncrl.trainer.losses.base import PolicyLossInputs, clip_metrics, log_ratio, masked_stats, register_loss


def detached_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    """r = π_θ/π_old with no gradient: it only weights the log-likelihood."""
    return torch.exp(log_ratio(inputs.logprobs.detach(), inputs.behaviour_logprobs))


@register_loss("tis")
def tis_loss(inputs: PolicyLossInputs, params: TISParams) -> tuple[torch.Tensor, dict[str, float]]:
    """−sg(min(r, c))·A·log π_θ; with no cap, −sg(r)·A·log π_θ (plain importance sampling)."""
    ratio = detached_ratio(inputs)
    weight = ratio if params.cap is None else ratio.clamp(max=params.cap)
    never = torch.zeros_like(ratio, dtype=torch.bool)
    metrics = clip_metrics(never, never if params.cap is None else ratio > params.cap, inputs.loss_mask)
    metrics |= masked_stats(ratio, inputs.loss_mask, "ratio") | masked_stats(
        weight, inputs.loss_mask, "is_weight"
    )
    return -(weight * inputs.advantages * inputs.logprobs), metrics


@register_loss("cispo")
def cispo_loss(inputs: PolicyLossInputs, params: CISPOParams) -> tuple[torch.Tensor, dict[str, float]]:
    """−sg(clip(r, 1 − ε_low, 1 + ε_high))·A·log π_θ."""
    ratio = detached_ratio(inputs)
    low, high = 1 - params.eps_low, 1 + params.eps_high
    weight = ratio.clamp(low, high)
    metrics = clip_metrics(ratio < low, ratio > high, inputs.loss_mask)
    metrics |= masked_stats(ratio, inputs.loss_mask, "ratio") | masked_stats(
        weight, inputs.loss_mask, "is_weight"
    )
    return -(weight * inputs.advantages * inputs.logprobs), metrics
