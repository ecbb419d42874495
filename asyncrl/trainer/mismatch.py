"""Train–inference mismatch correction: the engine samples from π_infer, the trainer computes π_train.

The importance weight ρ = π_train_old/π_infer (the trainer's recompute of the behaviour policy over the
engine's log-probs) is formed per token, per sequence (product over its tokens, i.e. exp of the summed
log-ratio) or as the sequence's geometric mean (exp of the mean log-ratio), then either truncated at C
(weight min(ρ, C), nothing dropped), used as a filter (weight ρ inside [low, high], the token or whole
sequence dropped outside: masked IS) or only to reject (weight 1 inside, dropped outside: rejection sampling).
K3 rejection drops whole sequences whose mean per-token K3 = ρ − 1 − log ρ exceeds a threshold. Weights carry
no gradient; the caller multiplies them into the per-token loss and the mask into the loss mask, and uses
π_train_old as π_old in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.config.algorithm import LossConfig, MismatchConfig

MAX_LOG_RATIO = 20.0
"""Bound on a (sequence-summed) log-ratio before exponentiating, so long sequences cannot overflow."""
QUANTILES = (0.05, 0.5, 0.95)
METRIC_PREFIXES = ("mismatch/", "k3_rejection/")
"""Prefixes of the step-start correction's metrics (``compute_step_start_correction``)."""


@dataclass(frozen=True, kw_only=True)
class MismatchCorrection:
    """Weights and keep-mask [B, T] to fold into the loss, and metrics prefixed ``mismatch/``."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: dict[str, float]


def compute_mismatch_correction(
    train_logprobs: torch.Tensor,
    infer_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    config: MismatchConfig,
) -> MismatchCorrection:
    """Importance weights π_train/π_infer at ``config.granularity``, truncated or masked per ``config.mode``."""
    token_log_ratio = (train_logprobs.detach() - infer_logprobs) * loss_mask
    unit_log_ratio, unit_mask = _unit_log_ratio(token_log_ratio, loss_mask, config.granularity)
    unit_ratio = torch.exp(unit_log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    if config.mode == "truncate":
        weights, keep = unit_ratio.clamp(max=config.cap), torch.ones_like(unit_ratio)
    else:
        keep = ((unit_ratio >= config.low) & (unit_ratio <= config.high)).to(unit_ratio.dtype)
        weights = unit_ratio * keep if config.mode == "mask" else keep
    metrics = _metrics(
        token_log_ratio, loss_mask, unit_ratio[unit_mask > 0], keep.expand_as(loss_mask), config
    )
    return MismatchCorrection(
        weights=weights.expand_as(loss_mask), mask=keep.expand_as(loss_mask), metrics=metrics
    )


def _unit_log_ratio(
    token_log_ratio: torch.Tensor, loss_mask: torch.Tensor, granularity: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-ratio of each unit ([B, T] per token, [B, 1] per sequence) and which units hold any token."""
    if granularity == "token":
        return token_log_ratio, loss_mask
    token_counts = loss_mask.sum(dim=-1, keepdim=True)
    summed = token_log_ratio.sum(dim=-1, keepdim=True)
    nonempty = (token_counts > 0).to(loss_mask.dtype)
    if granularity == "sequence":
        return summed, nonempty
    return summed / token_counts.clamp(min=1.0), nonempty


def _metrics(
    token_log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    unit_ratios: torch.Tensor,
    keep: torch.Tensor,
    config: MismatchConfig,
) -> dict[str, float]:
    """KL(π_infer‖π_train) estimates over tokens, quantiles of the unit ratios, dropped/truncated fractions."""
    num_tokens = loss_mask.sum().clamp(min=1.0)
    k3 = (torch.expm1(token_log_ratio.clamp(max=MAX_LOG_RATIO)) - token_log_ratio) * loss_mask
    metrics = {
        "mismatch/kl_k1": float(-token_log_ratio.sum() / num_tokens),
        "mismatch/kl_k3": float(k3.sum() / num_tokens),
        "mismatch/masked_fraction": float(((1 - keep) * loss_mask).sum() / num_tokens),
    }
    if config.mode == "truncate":
        metrics["mismatch/truncated_fraction"] = (
            float((unit_ratios > config.cap).float().mean()) if unit_ratios.numel() else 0.0
        )
    metrics |= _ratio_quantiles(unit_ratios)
    return metrics


def _ratio_quantiles(unit_ratios: torch.Tensor) -> dict[str, float]:
    if unit_ratios.numel() == 0:
        values = [0.0] * (len(QUANTILES) + 2)
    else:
        quantiles = torch.quantile(
            unit_ratios.double(), torch.tensor(QUANTILES, dtype=torch.double, device=unit_ratios.device)
        )
        values = [float(unit_ratios.min()), *quantiles.tolist(), float(unit_ratios.max())]
    names = ["min", *(f"p{round(q * 100):02d}" for q in QUANTILES), "max"]
    return {f"mismatch/ratio_{name}": value for name, value in zip(names, values, strict=True)}


def k3_rejection_mask(
    train_logprobs: torch.Tensor, infer_logprobs: torch.Tensor, loss_mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B, 1], mean K3 [B]): a sequence is kept when the mean over its tokens of ρ − 1 − log ρ,
    ρ = π_train/π_infer, is at most ``threshold`` (a sequence without counted tokens is kept)."""
    log_ratio = ((train_logprobs.detach() - infer_logprobs) * loss_mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    k3 = (torch.expm1(log_ratio) - log_ratio) * loss_mask
    mean_k3 = k3.sum(dim=-1) / loss_mask.sum(dim=-1).clamp(min=1.0)
    return (mean_k3 <= threshold).to(loss_mask.dtype).unsqueeze(-1), mean_k3


def compute_step_start_correction(
    train_logprobs: torch.Tensor, infer_logprobs: torch.Tensor, loss_mask: torch.Tensor, config: LossConfig
) -> MismatchCorrection:
    """The mismatch correction and K3 rejection ``config`` asks for, combined: weights multiply, masks AND."""
    weights, keep = torch.ones_like(loss_mask), torch.ones_like(loss_mask)
    metrics: dict[str, float] = {}
    if config.mismatch is not None:
        mismatch = compute_mismatch_correction(train_logprobs, infer_logprobs, loss_mask, config.mismatch)
        weights, keep, metrics = mismatch.weights, mismatch.mask, dict(mismatch.metrics)
    if config.k3_rejection is not None:
        k3_keep, mean_k3 = k3_rejection_mask(
            train_logprobs, infer_logprobs, loss_mask, config.k3_rejection.threshold
        )
        keep = keep * k3_keep
        metrics |= _k3_metrics(k3_keep, mean_k3, loss_mask)
    return MismatchCorrection(weights=weights * keep, mask=keep.expand_as(loss_mask), metrics=metrics)


def _k3_metrics(keep: torch.Tensor, mean_k3: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
    counted = loss_mask.sum(dim=-1) > 0
    num_sequences = max(int(counted.sum()), 1)
    rejected = (keep.squeeze(-1) == 0) & counted
    return {
        "k3_rejection/rejected_fraction": float(rejected.sum()) / num_sequences,
        "k3_rejection/k3_mean": float(mean_k3[counted].mean()) if counted.any() else 0.0,
        "k3_rejection/k3_max": float(mean_k3[counted].max()) if counted.any() else 0.0,
    }
