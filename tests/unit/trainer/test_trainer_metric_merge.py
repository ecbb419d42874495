"""A step's metrics are the mini-batch's own, however its rows are split into micro-batches, also where K3
rejection drops whole rows from what the loss counts: each metric merges weighted by the tokens it is a mean
over (the loss-counted tokens for the loss's ratio and clip statistics, the trained tokens for entropy and the
OPSM / M2PO fractions). Weighted by trained tokens alone, a micro-batch holding a dropped row weighed more than
what its statistics counted, and the step's clip fraction depended on the split (which the token-balanced rank
split exposed: the sharded step's differed from one process's)."""

from __future__ import annotations

from test_trainer_fsdp import _assert_metrics_equal
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

from asyncrl.config.algorithm import AdvantageConfig, K3RejectionConfig, LossConfig, M2POConfig, OPSMConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.trainer.trainer import Trainer

LOSS = LossConfig(
    name="ppo",
    opsm=OPSMConfig(delta=0.05),
    k3_rejection=K3RejectionConfig(threshold=0.06),
    m2po=M2POConfig(threshold=0.05),
)


def _metrics(max_tokens: int) -> dict[str, float]:
    config = TrainerConfig(
        lr=1e-2,
        num_mini_batches=2,
        ppo_epochs=2,  # later mini-batches train on moved weights: ratios leave 1 and some clip
        shuffle_mini_batches=False,
        sequence_packing=False,
        max_tokens_per_microbatch=max_tokens,
    )
    trainer = Trainer(tiny_qwen2(), config, LOSS, AdvantageConfig(name="grpo"))
    groups = with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)
    return trainer.train_step(groups, policy_version=0)


def test_metrics_do_not_depend_on_the_micro_batch_split_when_k3_rejection_drops_rows():
    whole = _metrics(max_tokens=10_000)  # the mini-batch in one micro-batch
    per_row = _metrics(max_tokens=1)  # every row a micro-batch of its own
    assert 0 < whole["k3_rejection/rejected_fraction"] < 1, "no row dropped: the check could not fail"
    assert whole["clip_fraction"] > 0, "nothing clipped: the check could not fail"
    _assert_metrics_equal(per_row, whole)
