"""Vanilla REINFORCE, −A·log π_θ: the on-policy reference point, with no correction for stale samples."""

from __future__ import annotations

import torch

from asyncrl.trainer.losses.base import PolicyLossInputs, clip_metrics, log_ratio, masked_stats, register_loss


@register_loss("reinforce")
def reinforce_loss(inputs: PolicyLossInputs, params: None) -> tuple[torch.Tensor, dict[str, float]]:
    """−A·log π_θ; the ratio π_θ/π_old is only reported, to show how off-policy the batch was."""
    ratio = torch.exp(log_ratio(inputs.logprobs.detach(), inputs.behaviour_logprobs))
    never = torch.zeros_like(ratio, dtype=torch.bool)
    metrics = clip_metrics(never, never, inputs.loss_mask) | masked_stats(ratio, inputs.loss_mask, "ratio")
    return -(inputs.advantages * inputs.logprobs), metrics
