"""The typed input of every policy loss, the loss registry, the shared aggregation and masked statistics.

A registered loss maps ``PolicyLossInputs`` and its own parameter section to a per-token loss [B, T]
(−objective) and metrics; ``compute_policy_loss`` (in ``__init__``) then applies mismatch weights, the KL
penalty and the single ``aggregate`` function, so every loss honours the mask and the aggregation mode alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

MAX_LOG_RATIO = 20.0
"""Bound on |log π_θ/π_old| before exponentiating, so one wild token cannot overflow to inf."""


@dataclass(frozen=True, kw_only=True)
class PolicyLossInputs:
    """Right-padded [B, T] tensors for one (micro-)batch; ``loss_mask`` is float 1 on model tokens, else 0.

    Optional tensors are supplied by the trainer when the configuration asks for them (see
    ``LossConfig.needs_*``); a loss that needs a missing one raises ``ValueError`` naming it.
    """

    logprobs: torch.Tensor
    """log π_θ of each token under the current weights; carries the gradient."""
    behaviour_logprobs: torch.Tensor
    """log π_old: the engine's log-probs of the sampled tokens (the behaviour policy)."""
    advantages: torch.Tensor
    """Per-token advantages (the per-sample advantage broadcast over its tokens)."""
    loss_mask: torch.Tensor
    """1.0 on tokens that count, 0.0 on prompt, environment and padding tokens."""
    proximal_logprobs: torch.Tensor | None = None
    """log π_prox: the trainer's weights at the start of this step (decoupled_ppo, proximal 'recompute')."""
    ref_logprobs: torch.Tensor | None = None
    """log π_ref of the reference model (KL penalty and KL metric)."""
    train_behaviour_logprobs: torch.Tensor | None = None
    """The trainer's recompute of the behaviour policy's log-probs (train–inference mismatch correction)."""
    token_versions: torch.Tensor | None = None
    """Policy version that generated each token (decoupled_ppo, proximal 'loglinear')."""
    current_version: int | None = None
    """Version of the trainer's weights at the start of this step, i.e. π_prox's version."""
    sequence_rewards: torch.Tensor | None = None
    """Per-sample rewards [B] (topr splits positive from negative trajectories by them)."""
    m2po_mask: torch.Tensor | None = None
    """M2PO's keep-mask, computed by the trainer over the whole batch at step start (loss.m2po)."""

    def require(self, name: str, user: str) -> Any:
        """The optional field ``name``, or a ValueError saying that ``user`` (e.g. "loss 'topr'") needs it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{user} needs PolicyLossInputs.{name}, which the trainer did not supply")
        return value


LossFn = Callable[[PolicyLossInputs, Any], tuple[torch.Tensor, dict[str, float]]]
LOSS_REGISTRY: dict[str, LossFn] = {}


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Register a per-token loss under ``name`` (also list it in ``config.algorithm.LossName``)."""

    def decorator(fn: LossFn) -> LossFn:
        if name in LOSS_REGISTRY:
            raise ValueError(f"policy loss {name!r} is already registered")
        LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int | None = None
) -> torch.Tensor:
    """Reduce per-token ``values`` [B, T] to a scalar; tokens with mask 0 never count.

    - token-mean: Σ v·m / Σ m over the whole batch (every token weighs the same).
    - seq-mean-token-mean: mean over sequences of each sequence's token mean (every sequence weighs the same).
    - seq-mean-token-sum: mean over sequences of each sequence's token sum.
    - seq-mean-token-sum-norm: seq-mean-token-sum / L with L = ``norm_length`` or else T (Dr. GRPO's constant
      normaliser: no length bias, scale independent of the batch's lengths when L is fixed).
    Sequences with no counted token are left out of the sequence mean; an empty batch gives 0.
    """
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    token_counts = mask.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_sequence = masked.sum(dim=-1) / token_counts.clamp(min=1.0)
    elif mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        per_sequence = masked.sum(dim=-1)
    else:
        raise ValueError(
            "loss.aggregation must be one of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', "
            f"'seq-mean-token-sum-norm'; got {mode!r}"
        )
    loss = per_sequence.sum() / (token_counts > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (norm_length if norm_length is not None else values.shape[-1])
    return loss


def log_ratio(logprobs: torch.Tensor, base_logprobs: torch.Tensor) -> torch.Tensor:
    """log(π / π_base), clamped to ±MAX_LOG_RATIO."""
    return (logprobs - base_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def masked_fraction_of(condition: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of counted tokens where ``condition`` holds (0 if none count)."""
    return float((condition.float() * mask).sum() / mask.sum().clamp(min=1.0))


def masked_stats(values: torch.Tensor, mask: torch.Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}_min``, ``_mean`` and ``_max`` of ``values`` over counted tokens; none if no token counts.

    Why none rather than 0: the trainer merges micro-batches' statistics (min of the mins), and a 0 standing in
    for "no token" would win that merge, reporting a ratio of 0 that no token had."""
    selected = values.detach()[mask > 0]
    if selected.numel() == 0:
        return {}
    return {
        f"{prefix}_min": float(selected.min()),
        f"{prefix}_mean": float(selected.mean()),
        f"{prefix}_max": float(selected.max()),
    }


def clip_metrics(low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Fractions of counted tokens clipped (or truncated) from below, from above, and in total."""
    fraction_low = masked_fraction_of(low, mask)
    fraction_high = masked_fraction_of(high, mask)
    return {
        "clip_fraction_low": fraction_low,
        "clip_fraction_high": fraction_high,
        "clip_fraction": fraction_low + fraction_high,
    }
