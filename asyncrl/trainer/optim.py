"""AdamW with a linear warm-up then a constant or cosine learning rate, and global gradient-norm clipping.

An update whose gradient norm is not finite is skipped by the trainer (``Trainer._step_optimizers``); too many
in a row raise ``NonFiniteGradientError``.

The schedule is a pure function of the train step (``lr_multiplier``), so it is tested with exact values and
resumes exactly from a checkpointed step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from asyncrl.config.trainer import TrainerConfig


class NonFiniteGradientError(RuntimeError):
    """More optimizer updates in a row had a non-finite gradient norm than
    ``trainer.max_consecutive_skipped_updates`` allows: the run is diverging, not hitting a stray batch."""


def lr_multiplier(step: int, config: TrainerConfig) -> float:
    """Fraction of ``config.lr`` used at train step ``step`` (0-based).

    Warm-up: (step + 1) / (warmup_steps + 1) for step < warmup_steps, so the first step already moves.
    Then 1 (constant), or a half cosine from 1 at warmup_steps to min_lr_ratio at total_steps, held after.
    """
    if step < config.warmup_steps:
        return (step + 1) / (config.warmup_steps + 1)
    if config.schedule == "constant":
        return 1.0
    assert config.total_steps is not None  # guaranteed by TrainerConfig for 'cosine'
    progress = min(1.0, (step - config.warmup_steps) / (config.total_steps - config.warmup_steps))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


def build_optimizer(model: nn.Module, config: TrainerConfig, *, lr: float | None = None) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; 1-D ones (biases, norm weights) are exempt from weight decay.
    ``lr`` replaces ``config.lr`` (the critic's own rate)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=config.lr if lr is None else lr,
        betas=config.betas,
        eps=config.eps,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR following ``lr_multiplier``; call ``step()`` once per train step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, config))


def clip_gradients(parameters: Iterable[torch.Tensor], max_norm: float | None) -> float:
    """Clip the global L2 norm of the gradients to ``max_norm`` (None: only measure); return the norm before."""
    grads = [p for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(grads, math.inf if max_norm is None else max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor norm
