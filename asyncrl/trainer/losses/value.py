"""PPO's value loss: regress the critic's values on the GAE returns, optionally clipped around the step-start
values so one batch cannot move the critic far (the policy's trust region, for the critic)."""

from __future__ import annotations

import torch

from asyncrl.trainer.losses.base import aggregate, masked_fraction_of


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None,
    aggregation: str,
    norm_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """½·max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²) per token (½·(V − R)² with no ``clip``),
    aggregated like the policy loss; and metrics (the clipped share counts tokens whose clipped term won)."""
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token, clipped = 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        moved = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (moved - returns) ** 2
        per_token, clipped = 0.5 * torch.maximum(unclipped, clipped_error), clipped_error > unclipped
    loss = aggregate(per_token, mask, aggregation, norm_length)
    metrics = {
        "critic/value_loss": float(loss.detach()),
        "critic/value_clip_fraction": masked_fraction_of(clipped, mask),
    }
    return loss, metrics
