"""Per-token estimators of KL(π_θ‖π_ref) from log-probs of sampled tokens (Schulman, "Approximating KL").

With r = π_ref/π_θ at a sampled token: k1 = -log r (unbiased, high variance, can be negative),
k2 = ½(log r)² (biased, low variance, always >= 0), k3 = (r - 1) - log r (unbiased, low variance, >= 0).
Gradients flow through ``logprobs``; the log-ratio is clamped so that exp never overflows.
"""

from __future__ import annotations

import torch

MAX_LOG_RATIO = 20.0
"""Bound on |log r| before exponentiating: beyond it k3 would overflow and one token would swamp the batch."""


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate, same shape as the inputs; ``estimator`` is 'k1', 'k2' or 'k3'."""
    log_ratio = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # log π_ref/π_θ
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"KL estimator must be one of 'k1', 'k2', 'k3'; got {estimator!r}")
