"""Helpers to build hand-made loss inputs with exact importance ratios (float64 throughout)."""

from __future__ import annotations

import math

import torch

from asyncrl.trainer.losses import PolicyLossInputs


def tensor(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def make_inputs(
    logprobs: list[list[float]],
    ratios: list[list[float]],
    advantages: list[list[float]],
    mask: list[list[float]] | None = None,
    **extra: object,
) -> PolicyLossInputs:
    """Inputs whose π_θ/π_old equals ``ratios`` exactly: behaviour = logprobs − log(ratio)."""
    current = tensor(logprobs).requires_grad_(True)
    behaviour = tensor(logprobs) - tensor([[math.log(r) for r in row] for row in ratios])
    loss_mask = tensor(mask) if mask is not None else torch.ones_like(current)
    return PolicyLossInputs(
        logprobs=current,
        behaviour_logprobs=behaviour,
        advantages=tensor(advantages),
        loss_mask=loss_mask,
        **extra,
    )
