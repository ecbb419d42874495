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

import numpy as np
import torch

from asyncrl.config.algorithm import AdvantageConfig


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) from rewards, values and the mask (all [B, T]); 0 where the mask is 0.

    Computed on the host and returned on ``values``' device: the recursion is sequential in T, and on an
    accelerator each position would cost about ten kernel launches (~200k at T = 20k: seconds per step, all
    launch overhead), where here everything but the recursion is a few whole-batch ops and the recursion two
    vector ops over the batch per position. The arithmetic is the per-position recursion's, operation for
    operation, so the result is the same to the bit."""
    steps = loss_mask.cpu() > 0
    values_h = values.cpu()
    next_value = _next_step_values(values_h, steps)
    deltas = torch.where(steps, token_rewards.cpu() + gamma * next_value - values_h, 0.0)
    decay = torch.where(
        steps, values_h.new_tensor(gamma * lam), 1.0
    )  # off the steps the carry passes unchanged
    advantages = torch.where(steps, _reverse_carry(deltas, decay), 0.0)
    returns = (advantages + values_h) * loss_mask.cpu()
    return advantages.to(values.device), returns.to(values.device)


def _next_step_values(values: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """[B, T]: at t, the value at the row's first step after t, or 0 after its last (the episode has ended)."""
    batch_size, seq_len = steps.shape
    positions = torch.arange(seq_len).expand(batch_size, seq_len)
    first_step_from = (
        torch.where(steps, positions, seq_len).flip(1).cummin(1).values.flip(1)
    )  # first step ≥ t
    after = torch.cat([first_step_from[:, 1:], first_step_from.new_full((batch_size, 1), seq_len)], dim=1)
    return torch.cat([values, values.new_zeros(batch_size, 1)], dim=1).gather(1, after)


def _reverse_carry(deltas: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """[B, T] carry_t = deltas_t + decay_t · carry_{t+1} (carry_T = 0), in numpy over time-major copies: a small
    op costs well under a microsecond there, several in torch."""
    deltas_tb = deltas.T.contiguous().numpy()
    decay_tb = decay.T.contiguous().numpy()
    carry_tb = np.empty_like(deltas_tb)
    carry = np.zeros_like(deltas_tb[0])
    for t in range(deltas_tb.shape[0] - 1, -1, -1):
        carry = deltas_tb[t] + decay_tb[t] * carry
        carry_tb[t] = carry
    return torch.from_numpy(carry_tb).T


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
