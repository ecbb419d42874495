"""Every ranks x micro-batches split of a mini-batch weighs its parts to the whole mini-batch's loss."""

import pytest
import torch

from asyncrl.config.algorithm import AGGREGATIONS, LossConfig
from asyncrl.trainer.distributed.normalisation import combine, global_accumulation_weight, local_denominator
from asyncrl.trainer.losses.base import aggregate


def _split_loss(values, mask, config, ranks, micros):
    """Mean over ranks of each rank's weighted micro-batch sum, each part trimmed to its own widest row."""
    rank_rows = torch.arange(values.shape[0]).tensor_split(ranks)
    total = combine([local_denominator(mask[rows]) for rows in rank_rows])
    per_rank = []
    for rows in rank_rows:
        loss = torch.tensor(0.0)
        for micro in rows.tensor_split(micros):
            width = max(int(mask[micro].sum(-1).max()), 1)
            v, m = values[micro, :width], mask[micro, :width]
            part = aggregate(v, m, config.aggregation, config.norm_length)
            loss = loss + global_accumulation_weight(config, m, total, ranks) * part
        per_rank.append(loss)
    return torch.stack(per_rank).mean()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(("ranks", "micros"), [(1, 4), (2, 2), (4, 1)])
def test_split_equals_whole(aggregation, ranks, micros):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(8, 12, generator=gen)
    lengths = torch.tensor([12, 3, 7, 1, 9, 5, 11, 2])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).float()
    config = LossConfig(aggregation=aggregation)
    whole = aggregate(values, mask, aggregation, config.norm_length)
    torch.testing.assert_close(_split_loss(values, mask, config, ranks, micros), whole, rtol=1e-6, atol=1e-7)
