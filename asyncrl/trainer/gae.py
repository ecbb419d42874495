"""Generalised advantage estimation (Schulman et al. 2016) over a batch's model tokens.

The decision process's steps are the model's tokens: the state before token t is the context up to it, its
value V_t the critic's output there, and the reward r_t whatever fell on token t (a turn's reward on its last
token, a total on the last token). Prompt, environment and padding tokens (loss mask 0) are not steps: the
recursion skips them, so an environment observation between two turns is part of the next state, not a step
of its own. After a row's last model token the episode has ended (value 0).

    δ_t = r_t + γ·V_next − V_t,   A_t = δ_t + γλ·A_next,   R_t = A_t + V_t

with "next" the row's next model token. Rewards on tokens with mask 0 are never read (the batch refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.config.algorithm import AdvantageConfig


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) from rewards, values and the mask (all [B, T]); 0 where the mask is 0."""
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_advantage = values.new_zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        step = loss_mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        next_value = torch.where(step, values[:, t], next_value)
        next_advantage = torch.where(step, advantage, next_advantage)
    return advantages, (advantages + values) * loss_mask


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(values − mean) / (std + eps) over the tokens with mask 1 (unbiased std; 0 for a single token)."""
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1.0)
    variance = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1.0)
    std = variance.sqrt() if count > 1 else torch.zeros_like(variance)
    return (values - mean) / (std + eps) * mask


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V)/Var(R) over the counted tokens: 1 is a perfect critic, 0 no better than a constant."""
    count = mask.sum().clamp(min=1.0)
    centred = returns - (returns * mask).sum() / count
    residual = returns - values
    residual = residual - (residual * mask).sum() / count
    variance = ((centred * mask) ** 2).sum() / count
    if float(variance) == 0.0:
        return 0.0
    return float(1 - ((residual * mask) ** 2).sum() / count / variance)


@dataclass(frozen=True)
class GAETargets:
    """What a train step needs from GAE: the advantages the policy loss reads, the returns the value loss
    regresses on, and metrics of the critic's step-start values."""

    advantages: torch.Tensor  # [B, T], whitened when the config says so
    returns: torch.Tensor  # [B, T]
    metrics: dict[str, float]


def gae_targets(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, config: AdvantageConfig
) -> GAETargets:
    """GAE with ``config``'s γ and λ on the critic's ``values``, then whitening if asked."""
    assert config.gamma is not None and config.lam is not None  # AdvantageConfig fills them for 'gae'
    advantages, returns = gae(token_rewards, values, loss_mask, config.gamma, config.lam)
    count = loss_mask.sum().clamp(min=1.0)
    metrics = {
        "critic/values_mean": float((values * loss_mask).sum() / count),
        "critic/returns_mean": float(returns.sum() / count),
        "critic/explained_variance": explained_variance(values, returns, loss_mask),
        "critic/advantages_mean": float(advantages.sum() / count),
    }
    if config.whiten:
        advantages = whiten(advantages, loss_mask, config.eps or 0.0)
    return GAETargets(advantages, returns, metrics)
