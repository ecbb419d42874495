"""Decoupled PPO (Hilton et al. 2022; AReaL): trust region around the proximal policy, not the behaviour one.

objective = (π_prox/π_old) · min(ρ·A, clip(ρ, 1 - ε_low, 1 + ε_high)·A), ρ = π_θ/π_prox, with the weight
π_prox/π_old a constant; this equals min(r·A, (π_prox/π_old)·clip(π_θ/π_prox)·A) with r = π_θ/π_old.
"""

from __future__ import annotations

import torch

from asyncrl.config.algorithm import DecoupledPPOParams
from asyncrl.trainer.losses.base import PolicyLossInputs, clip_metrics, log_ratio, masked_stats, register_loss
from asyncrl.trainer.losses.ppo import clipped_surrogate, clipped_tokens


def loglinear_proximal_logprobs(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    token_versions: torch.Tensor,
    current_version: int,
) -> torch.Tensor:
    """log π_prox ≈ log π_old + α·(sg(log π_θ) − log π_old), with α = (V − v)/(V + 1 − v) per token.

    V is π_prox's version (the weights at the start of this step), v the version that generated the token,
    and π_θ counts as version V + 1 (the one this step produces): the interpolation is linear in log-space
    along the version axis. A fresh token (v = V) gets π_prox = π_old exactly; staler tokens lean toward π_θ.
    """
    staleness = (current_version - token_versions).clamp(min=0).to(logprobs.dtype)
    alpha = staleness / (staleness + 1)
    return behaviour_logprobs + alpha * (logprobs.detach() - behaviour_logprobs)


def _proximal_logprobs(inputs: PolicyLossInputs, params: DecoupledPPOParams) -> torch.Tensor:
    user = f"loss 'decoupled_ppo' with proximal '{params.proximal}'"
    if params.proximal == "recompute":
        return inputs.require("proximal_logprobs", user).detach()
    versions = inputs.require("token_versions", user)
    current_version = inputs.require("current_version", user)
    if ((versions > current_version) & (inputs.loss_mask > 0)).any():
        raise ValueError(f"token_versions exceed current_version {current_version}: a token from the future")
    return loglinear_proximal_logprobs(inputs.logprobs, inputs.behaviour_logprobs, versions, current_version)


@register_loss("decoupled_ppo")
def decoupled_ppo_loss(
    inputs: PolicyLossInputs, params: DecoupledPPOParams
) -> tuple[torch.Tensor, dict[str, float]]:
    """−(π_prox/π_old)·min(ρ·A, clip(ρ)·A) with ρ = π_θ/π_prox."""
    proximal = _proximal_logprobs(inputs, params)
    behaviour_weight = torch.exp(log_ratio(proximal, inputs.behaviour_logprobs))
    proximal_ratio = torch.exp(log_ratio(inputs.logprobs, proximal))
    advantages, mask = inputs.advantages, inputs.loss_mask
    objective = behaviour_weight * clipped_surrogate(
        proximal_ratio, advantages, params.eps_low, params.eps_high
    )
    metrics = clip_metrics(*clipped_tokens(proximal_ratio, advantages, params.eps_low, params.eps_high), mask)
    metrics |= masked_stats(torch.exp(log_ratio(inputs.logprobs, inputs.behaviour_logprobs)), mask, "ratio")
    metrics |= masked_stats(proximal_ratio, mask, "proximal_ratio")
    metrics |= masked_stats(behaviour_weight, mask, "behaviour_weight")
    return -objective, metrics
