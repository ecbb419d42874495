"""A trainer rank reports its step's metrics and how evenly the step's rows were dealt over the ranks: the
trainer keeps ``rank_token_imbalance`` apart from ``train_step``'s split-independent metrics, so the rank actor
is where it reaches the controller's log."""

from __future__ import annotations

import torch

from asyncrl.config.run import load_run_config
from asyncrl.runtime import trainer_group as tg


class FakeTrainer:
    """Stands in for a sharded ``Trainer``: a step's metrics, then the split's."""

    def __init__(self) -> None:
        self.split_metrics: dict[str, float] = {}

    def train_step(self, groups: list, policy_version: int) -> dict[str, float]:
        self.split_metrics = {"rank_token_imbalance": 1.25}
        return {"loss": 0.5, "version": float(policy_version)}


def test_a_rank_reports_the_steps_split_beside_its_metrics() -> None:
    config = load_run_config(None, ["runtime.type=local", "trainer.num_workers=2"])
    rank = tg.TrainerRankActor(config, rank=0, world_size=2, num_threads=torch.get_num_threads())
    rank.trainer = FakeTrainer()  # type: ignore[assignment]
    assert rank.train_step([], policy_version=3) == {"loss": 0.5, "version": 3.0, "rank_token_imbalance": 1.25}
