"""Off-policy masks that drop stale samples instead of reweighting them: OPSM and M2PO.

- OPSM (DeepSeek-V3.2's off-policy sequence masking) zeroes the loss of a whole sequence when its advantage is
  negative and its KL from the behaviour policy to the current one, (1/|o|)·Σ_t log π_old/π_θ, exceeds δ.
  Pushing down a response the policy has already moved away from is what destabilises off-policy training;
  positive sequences keep their signal. π_old is the engine's log-probs, so the KL counts staleness and
  train–inference mismatch together; it moves with π_θ, so it is computed per micro-batch (no gradient).
- M2PO (Zheng et al. 2025) bounds the second moment of the log-ratio: over the whole batch at step start it
  masks the tokens with the largest (log π_θ/π_old)² until the mean over the remaining tokens is at most τ.
  Only extreme tokens go, so most of a stale batch still trains.

Both masks multiply the per-token loss; the aggregation denominators are left as they are (as in the papers'
objectives, a masked token counts as a zero).
"""

from __future__ import annotations

import torch


def opsm_keep(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep [B, 1], KL [B]): a sequence is dropped when its mean advantage over counted tokens is negative and
    its mean log π_old/π_θ over them exceeds ``delta``; a sequence without counted tokens is kept."""
    counts = loss_mask.sum(dim=-1).clamp(min=1.0)
    kl = ((behaviour_logprobs - logprobs.detach()) * loss_mask).sum(dim=-1) / counts
    sequence_advantage = (advantages * loss_mask).sum(dim=-1) / counts
    dropped = (sequence_advantage < 0) & (kl > delta)
    return (~dropped).to(loss_mask.dtype).unsqueeze(-1), kl


def m2po_keep(
    log_ratio: torch.Tensor, loss_mask: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, float]:
    """(keep [B, T], second moment before masking): the counted tokens less the fewest largest-(log r)² ones
    that must go for the mean of (log r)² over the rest to be <= ``threshold``. Removing the largest value never raises the mean, so the
    smallest such count is found in one pass over the sorted values; ties go in position order."""
    counted = (loss_mask > 0).flatten()
    squared = (log_ratio.detach().double() ** 2).flatten()[counted]
    keep = (loss_mask > 0).to(loss_mask.dtype)
    num_tokens = squared.numel()
    if num_tokens == 0:
        return keep, 0.0
    order = torch.sort(squared, descending=True, stable=True).indices
    removed_sums = torch.cat([squared.new_zeros(1), squared[order].cumsum(0)])  # [n + 1]: k largest removed
    rest_counts = torch.arange(num_tokens, -1, -1, dtype=squared.dtype, device=squared.device)
    rest_means = (removed_sums[-1] - removed_sums) / rest_counts.clamp(min=1.0)
    fits = (rest_means <= threshold) | (rest_counts == 0)
    num_masked = int(torch.nonzero(fits)[0])
    positions = torch.nonzero(counted).squeeze(-1)[order[:num_masked]]
    keep.view(-1)[positions] = 0.0
    return keep, float(removed_sums[-1] / num_tokens)
