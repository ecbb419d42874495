"""Advantage estimators over per-sample rewards, registered by name.

Each maps rewards [B] and group ids [B] to advantages [B]; the trainer broadcasts them over the sample's tokens.
GAE, which needs per-token rewards and the critic's values, is ``trainer/gae.py``.
Standard deviations are the unbiased (n - 1) ones, as in GRPO's reference implementations; a set of one sample
has no spread, so its std is taken as 0. A group of size one therefore gets advantage 0 under the group
estimators (its own mean is its baseline), and a zero-variance group gets 0 everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from asyncrl.config.algorithm import AdvantageConfig

AdvantageFn = Callable[[torch.Tensor, torch.Tensor, AdvantageConfig], torch.Tensor]
ADVANTAGE_REGISTRY: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator under ``name`` (must also be listed in config.algorithm.AdvantageName)."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_REGISTRY:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_REGISTRY[name] = fn
        return fn

    return decorator


def compute_advantages(
    name: str, rewards: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """Advantages [B] of rewards [B] whose groups are given by integer ``group_ids`` [B]."""
    if name == "gae":
        raise ValueError(
            "advantage 'gae' needs the critic's values: the trainer computes it (trainer/gae.py)"
        )
    if name not in ADVANTAGE_REGISTRY:
        raise ValueError(f"advantage.name must be one of {sorted(ADVANTAGE_REGISTRY)}; got {name!r}")
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(
            f"rewards and group_ids must both be [B], got {tuple(rewards.shape)}, {tuple(group_ids.shape)}"
        )
    return ADVANTAGE_REGISTRY[name](rewards.float(), group_ids, config)


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std of the sample's group ([B] each; std 0 for a group of one)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    counts = _sum_by_group(torch.ones_like(rewards), inverse)
    means = _sum_by_group(rewards, inverse) / counts
    squared = _sum_by_group((rewards - means[inverse]) ** 2, inverse)
    stds = torch.where(counts > 1, (squared / (counts - 1).clamp(min=1)).sqrt(), torch.zeros_like(squared))
    return means[inverse], stds[inverse]


def _sum_by_group(values: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` [B] per group index in ``inverse`` [B] -> [num_groups]."""
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, inverse, values)


def _batch_std(values: torch.Tensor) -> torch.Tensor:
    return values.std() if values.numel() > 1 else torch.zeros((), dtype=values.dtype, device=values.device)


@register_advantage("grpo")
def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """(r - group mean) / (group std + eps)."""
    means, stds = _group_stats(rewards, group_ids)
    return (rewards - means) / (stds + config.eps)


@register_advantage("dr_grpo")
def dr_grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """r - group mean: Dr. GRPO drops the std division, which over-weights easy and hard prompts."""
    means, _ = _group_stats(rewards, group_ids)
    return rewards - means


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """(r - batch mean) / (batch std + eps): REINFORCE++'s global normalisation, no groups needed."""
    return (rewards - rewards.mean()) / (_batch_std(rewards) + config.eps)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """REINFORCE++-baseline: subtract the group mean, then divide by the std of the result over the batch."""
    centred = rewards - _group_stats(rewards, group_ids)[0]
    return centred / (_batch_std(centred) + config.eps)
