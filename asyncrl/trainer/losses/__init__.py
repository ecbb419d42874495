"""Policy losses registered by name, and ``compute_policy_loss``, the one entry point the trainer calls.

Order of work: OPSM's sequence mask (from the engine's π_old, before anything replaces it) → step-start
correction (mismatch and K3 rejection: π_old := π_train_old, weights and mask) → the registered per-token loss
→ × correction weights × OPSM and M2PO masks → + β·KL(π_θ‖π_ref) → ``aggregate`` under the configured mode.
The trainer never branches on the loss name; it only supplies the inputs that ``LossConfig.needs_*`` ask for.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from asyncrl.config.algorithm import KLConfig, LossConfig
from asyncrl.trainer.kl import kl_estimate
from asyncrl.trainer.losses import decoupled_ppo, importance, ppo, reinforce, topr  # noqa: F401  (registration)
from asyncrl.trainer.losses.base import LOSS_REGISTRY, PolicyLossInputs, aggregate, register_loss
from asyncrl.trainer.mismatch import compute_step_start_correction
from asyncrl.trainer.offpolicy import opsm_keep

__all__ = ["LOSS_REGISTRY", "PolicyLossInputs", "aggregate", "compute_policy_loss", "register_loss"]


def compute_policy_loss(
    name: str, inputs: PolicyLossInputs, config: LossConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss (−objective, aggregated) for ``inputs`` and metrics as plain floats."""
    if name not in LOSS_REGISTRY:
        raise ValueError(f"loss.name must be one of {', '.join(sorted(LOSS_REGISTRY))}; got {name!r}")
    if name != config.name:
        raise ValueError(f"compute_policy_loss got loss {name!r} but loss.name is {config.name!r}")
    drop_masks, metrics = _drop_masks(inputs, config)
    inputs, weights, correction_metrics = _apply_step_start_correction(inputs, config)
    metrics |= correction_metrics
    token_loss, loss_metrics = LOSS_REGISTRY[name](inputs, config.params)
    metrics |= loss_metrics
    for factor in (weights, *drop_masks):
        if factor is not None:
            token_loss = token_loss * factor
    token_loss = token_loss + _kl_penalty(inputs, config.kl, metrics)
    loss = aggregate(token_loss, inputs.loss_mask, config.aggregation, config.norm_length)
    metrics["masked_fraction"] = float(1 - inputs.loss_mask.sum() / max(inputs.loss_mask.numel(), 1))
    metrics["policy_loss"] = float(loss.detach())
    return loss, metrics


def _apply_step_start_correction(
    inputs: PolicyLossInputs, config: LossConfig
) -> tuple[PolicyLossInputs, torch.Tensor | None, dict[str, float]]:
    """With mismatch correction or K3 rejection on, the loss sees π_train_old as π_old and their keep-mask
    folded into the loss mask."""
    if not config.replaces_behaviour:
        return inputs, None, {}
    train_logprobs = inputs.require("train_behaviour_logprobs", "loss.mismatch / loss.k3_rejection")
    correction = compute_step_start_correction(
        train_logprobs, inputs.behaviour_logprobs, inputs.loss_mask, config
    )
    corrected = replace(
        inputs, behaviour_logprobs=train_logprobs, loss_mask=inputs.loss_mask * correction.mask
    )
    return corrected, correction.weights, dict(correction.metrics)


def _drop_masks(inputs: PolicyLossInputs, config: LossConfig) -> tuple[list[torch.Tensor], dict[str, float]]:
    """OPSM's and M2PO's keep-masks (multiplied into the per-token loss) and their masked fractions."""
    masks, metrics = [], {}
    num_tokens = inputs.loss_mask.sum().clamp(min=1.0)
    if config.opsm is not None:
        keep, kl = opsm_keep(
            inputs.logprobs, inputs.behaviour_logprobs, inputs.advantages, inputs.loss_mask, config.opsm.delta
        )
        masks.append(keep)
        metrics["opsm/masked_fraction"] = float(((1 - keep) * inputs.loss_mask).sum() / num_tokens)
        metrics["opsm/kl"] = float((kl * inputs.loss_mask.sum(-1)).sum() / num_tokens)
    if config.m2po is not None:
        keep = inputs.require("m2po_mask", "loss.m2po")
        masks.append(keep)
        metrics["m2po/masked_fraction"] = float(((1 - keep) * inputs.loss_mask).sum() / num_tokens)
    return masks, metrics


def _kl_penalty(
    inputs: PolicyLossInputs, config: KLConfig, metrics: dict[str, float]
) -> torch.Tensor | float:
    """β·KL per token (0 when β is 0); the token-mean KL is reported whenever reference log-probs exist."""
    if inputs.ref_logprobs is None:
        if config.beta > 0:
            raise ValueError(
                "loss.kl.beta > 0 needs PolicyLossInputs.ref_logprobs, which the trainer did not supply"
            )
        return 0.0
    kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, config.estimator)
    metrics["kl"] = float(aggregate(kl.detach(), inputs.loss_mask, "token-mean"))
    return config.beta * kl if config.beta > 0 else 0.0
