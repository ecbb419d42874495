"""PPO-clip (optionally dual-clip) and GRPO, whose KL term is the shared ``loss.kl`` penalty."""

from __future__ import annotations

import torch

from asyncrl.config.algorithm import ClipParams
from asyncrl.trainer.losses.base import (
    PolicyLossInputs,
    clip_metrics,
    log_ratio,
    masked_fraction_of,
    masked_stats,
    register_loss,
)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """min(r·A, clip(r, 1 - eps_low, 1 + eps_high)·A), per token."""
    return torch.minimum(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)


def clipped_tokens(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens whose clipped branch is active (zero gradient): below 1 - eps_low with A < 0, above with A > 0."""
    return (ratio < 1 - eps_low) & (advantages < 0), (ratio > 1 + eps_high) & (advantages > 0)


@register_loss("ppo")
def ppo_loss(inputs: PolicyLossInputs, params: ClipParams) -> tuple[torch.Tensor, dict[str, float]]:
    """−min(r·A, clip(r)·A), r = π_θ/π_old; with dual clip c, negative-advantage tokens lose at most c·|A|."""
    ratio = torch.exp(log_ratio(inputs.logprobs, inputs.behaviour_logprobs))
    advantages, mask = inputs.advantages, inputs.loss_mask
    objective = clipped_surrogate(ratio, advantages, params.eps_low, params.eps_high)
    metrics = clip_metrics(*clipped_tokens(ratio, advantages, params.eps_low, params.eps_high), mask)
    metrics |= masked_stats(ratio, mask, "ratio")
    if params.dual_clip is not None:
        dual = (advantages < 0) & (ratio > params.dual_clip)
        objective = torch.where(
            advantages < 0, torch.maximum(objective, params.dual_clip * advantages), objective
        )
        metrics["dual_clip_fraction"] = masked_fraction_of(dual, mask)
    return -objective, metrics


@register_loss("grpo")
def grpo_loss(inputs: PolicyLossInputs, params: ClipParams) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's policy term is PPO-clip; its β·KL(π_θ‖π_ref) term comes from loss.kl (beta > 0 is enforced)."""
    return ppo_loss(inputs, params)
