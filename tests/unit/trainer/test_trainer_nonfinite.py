"""A non-finite gradient norm skips the optimizer update on every rank, and too many in a row fail by name.

The loss of one micro-batch (on one rank, under FSDP2) is multiplied by inf: its gradient, reduced over the
ranks, makes the global norm non-finite on all of them. Without the guard AdamW wrote NaN into every rank's
weights, which were then published. Checked: the weights and AdamW's state are unchanged on every rank, the
step and version move on and count the skip, and the next finite step gives exactly the weights a trainer that
never saw the bad step reaches in its first step (same batch, constant learning rate, AdamW state untouched).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from trainer_fixtures import random_groups, tiny_qwen2, with_model_logprobs

import asyncrl.trainer.trainer as trainer_module
from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.trainer import TrainerConfig
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.distributed.parallel import Parallelism, SingleProcess
from asyncrl.trainer.optim import NonFiniteGradientError
from asyncrl.trainer.trainer import Trainer


@contextlib.contextmanager
def _infinite_loss(active: bool = True) -> Iterator[None]:
    """The trainer's policy loss times inf in every micro-batch of this process while ``active``."""
    original = trainer_module.compute_policy_loss

    def poisoned(name, inputs, config):
        loss, metrics = original(name, inputs, config)
        return loss * math.inf, metrics

    if active:
        trainer_module.compute_policy_loss = poisoned
    try:
        yield
    finally:
        trainer_module.compute_policy_loss = original


def _trainer(parallel: Parallelism, **config) -> Trainer:
    return Trainer(
        tiny_qwen2(),
        TrainerConfig(lr=1e-2, **config),
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=parallel,
    )


def _groups():
    return with_model_logprobs(random_groups(num_groups=2, group_size=4, seed=1), tiny_qwen2(), noise=0.5)


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Full copies of the weights (a collective under FSDP2: every rank calls it)."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
        for name, p in trainer.model.named_parameters()
    }


def _skip_then_step(parallel: Parallelism, poisoned_rank: int) -> dict:
    """A step whose loss is inf on ``poisoned_rank``, then a finite one; and a fresh trainer's finite step."""
    trainer = _trainer(parallel)
    before = _weights(trainer)
    with _infinite_loss(parallel.rank == poisoned_rank):
        skipped = trainer.train_step(_groups(), policy_version=0)
    after_skip = _weights(trainer)
    adam_state = len(trainer.optimizer.state)
    stepped = trainer.train_step(_groups(), policy_version=1)
    after_step = _weights(trainer)
    fresh = _trainer(parallel)
    fresh.train_step(_groups(), policy_version=0)
    return {
        "skipped": skipped,
        "stepped": stepped,
        "unchanged": all(torch.equal(after_skip[n], before[n]) for n in before),
        "adam_state_after_skip": adam_state,
        "moved": any(not torch.equal(after_step[n], before[n]) for n in before),
        "as_fresh": all(torch.equal(after_step[n], w) for n, w in _weights(fresh).items()),
        "version": trainer.version,
        "step": trainer.step,
    }


def _sharded(poisoned_rank: int) -> dict:
    from asyncrl.trainer.distributed.parallel import FullyShardedParallel

    return _skip_then_step(FullyShardedParallel("cpu"), poisoned_rank)


def _check(result: dict) -> None:
    assert result["unchanged"], "a skipped update changed the weights"
    assert result["adam_state_after_skip"] == 0, "a skipped update stepped AdamW"
    assert result["skipped"]["skipped_updates"] == 1.0
    assert "grad_norm" not in result["skipped"]  # a non-finite norm is not averaged into the step's
    assert result["stepped"]["skipped_updates"] == 0.0 and math.isfinite(result["stepped"]["grad_norm"])
    assert result["moved"] and result["as_fresh"]
    assert (result["step"], result["version"]) == (2, 2)


def test_a_non_finite_norm_skips_the_update_in_one_process():
    _check(_skip_then_step(SingleProcess(), poisoned_rank=0))


def test_a_non_finite_loss_on_one_rank_skips_the_update_on_every_rank():
    for result in run_ranks(_sharded, 2, 1):
        _check(result)


def test_too_many_skipped_updates_in_a_row_fail_by_name():
    trainer = _trainer(SingleProcess(), max_consecutive_skipped_updates=1, num_mini_batches=2)
    with (
        _infinite_loss(),
        pytest.raises(NonFiniteGradientError, match="max_consecutive_skipped_updates is 1"),
    ):
        trainer.train_step(_groups(), policy_version=0)  # the second mini-batch's update is the second skip
    assert trainer.skipped_in_a_row == 2


def test_a_finite_update_resets_the_count():
    trainer = _trainer(SingleProcess(), max_consecutive_skipped_updates=1)
    with _infinite_loss():
        trainer.train_step(_groups(), policy_version=0)
    trainer.train_step(_groups(), policy_version=1)
    with _infinite_loss():
        assert trainer.train_step(_groups(), policy_version=2)["skipped_updates"] == 1.0
    assert trainer.skipped_in_a_row == 1
