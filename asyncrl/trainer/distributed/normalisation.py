"""Loss normalisation that gives the same gradient for any ranks x micro-batches split of a mini-batch.

The classic bug is each rank normalising by its own token count (token-mean per rank, then the gradient
all-reduce averages the ranks): ranks with fewer tokens then weigh each token more. Here every rank first
agrees on the *global* mini-batch denominator (masked tokens, counted sequences, widest row), all-reduced
before any backward, and weights each micro-batch by its share of that global count. Data-parallel gradient
reduction averages over ranks, so the weight is multiplied by the world size to turn that average into a sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.config.algorithm import LossConfig


@dataclass(frozen=True, kw_only=True)
class GlobalDenominator:
    """What a mini-batch's aggregated loss divides by, summed (or maxed) over every rank's rows."""

    tokens: float
    """Masked tokens of the whole mini-batch (token-mean divides by this)."""
    sequences: float
    """Non-empty sequences of the whole mini-batch (the sequence means divide by this)."""
    width: int
    """Widest row of the whole mini-batch (seq-mean-token-sum-norm without norm_length divides by this)."""


def local_denominator(mask: torch.Tensor) -> torch.Tensor:
    """This rank's [tokens, sequences, width] of its rows' aggregation mask [rows, width], as a float tensor
    ready for ``all_reduce`` (sum the first two, max the third; see ``combine``)."""
    return torch.tensor([float(mask.sum()), float((mask.sum(-1) > 0).sum()), float(mask.shape[-1])])


def combine(per_rank: list[torch.Tensor]) -> GlobalDenominator:
    """The global denominator from every rank's ``local_denominator`` (what the all-reduces compute)."""
    stacked = torch.stack(per_rank)
    return GlobalDenominator(
        tokens=float(stacked[:, 0].sum()),
        sequences=float(stacked[:, 1].sum()),
        width=int(stacked[:, 2].max()),
    )


def global_accumulation_weight(
    loss_config: LossConfig, micro_mask: torch.Tensor, total: GlobalDenominator, world_size: int
) -> float:
    """Factor on one rank's micro-batch aggregated loss so that, after the ranks' gradients are *averaged*,
    the result is the gradient of the whole mini-batch's loss (``trainer.accumulation_weight`` for one rank)."""
    if loss_config.aggregation == "token-mean":
        share = float(micro_mask.sum()) / max(total.tokens, 1.0)
    else:
        share = float((micro_mask.sum(-1) > 0).sum()) / max(total.sequences, 1.0)
        if loss_config.aggregation == "seq-mean-token-sum-norm" and loss_config.norm_length is None:
            share *= micro_mask.shape[-1] / max(total.width, 1)
    return share * world_size
