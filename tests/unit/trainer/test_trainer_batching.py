"""Exact tests of build_train_batch (alignment, padding), the token-budget micro-batcher and mini-batch splits."""

from __future__ import annotations

import pytest
import torch
from trainer_fixtures import make_trajectory

from asyncrl.trainer.batching import (
    build_train_batch,
    plan_micro_batches,
    plan_mini_batches,
    select_rows,
    sequence_lengths,
)
from asyncrl.types import Group, Trajectory


def _two_groups() -> list[Group]:
    a0 = make_trajectory([5, 6], [7, 8, 9], reward=1.0, uid="a", index=0, version=3)
    a1 = make_trajectory([5, 6], [10], reward=0.0, uid="a", index=1, version=3)
    b0 = make_trajectory([11], [12, 13], reward=0.5, uid="b", index=0, version=2)
    return [Group(prompt_uid="a", trajectories=[a0, a1]), Group(prompt_uid="b", trajectories=[b0])]


def test_build_train_batch_is_right_padded_and_aligned_with_input_ids():
    batch = build_train_batch(_two_groups(), [0.5, -0.5, 2.0], pad_token_id=99)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 10, 99, 99], [11, 12, 13, 99, 99]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0], [0, 1, 1, 0, 0]]
    # behaviour_logprobs[b, t] is the engine's log-prob of input_ids[b, t]: same column as its token.
    assert batch.behaviour_logprobs.tolist() == [[0, 0, -1, -1, -1], [0, 0, -1, 0, 0], [0, -1, -1, 0, 0]]
    assert batch.token_versions.tolist() == [[-1, -1, 3, 3, 3], [-1, -1, 3, -1, -1], [-1, 2, 2, -1, -1]]
    assert batch.advantages.tolist() == [[0, 0, 0.5, 0.5, 0.5], [0, 0, -0.5, 0, 0], [0, 2, 2, 0, 0]]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.group_ids.tolist() == [0, 0, 1]
    assert batch.start_versions.tolist() == [3, 3, 2]
    assert batch.sample_uids == ["a#0", "a#1", "b#0"]
    assert batch.loss_mask.dtype == torch.float32 and batch.input_ids.dtype == torch.long


def test_build_train_batch_rejects_malformed_input():
    groups = _two_groups()
    with pytest.raises(ValueError, match="one value per trajectory"):
        build_train_batch(groups, [1.0, 2.0])
    bad = make_trajectory([], [1, 2], reward=0.0, uid="x")
    with pytest.raises(ValueError, match="x#0: the first token cannot be trained"):
        build_train_batch([Group(prompt_uid="x", trajectories=[bad])], [0.0])
    short = Trajectory(
        prompt_uid="y",
        sample_index=0,
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0],
        versions=[-1, 0],
        start_version=0,
        num_prompt_tokens=1,
    )
    with pytest.raises(ValueError, match="y#0: logprobs has 1 entries for 2 tokens"):
        build_train_batch([Group(prompt_uid="y", trajectories=[short])], [0.0])
    with pytest.raises(ValueError, match="at least one trajectory"):
        build_train_batch([], [])


def test_select_rows_keeps_order_and_drops_padding_columns():
    batch = build_train_batch(_two_groups(), [0.5, -0.5, 2.0], pad_token_id=99)
    sub = select_rows(batch, [2, 1])
    assert sub.input_ids.tolist() == [[11, 12, 13], [5, 6, 10]]
    assert sub.loss_mask.tolist() == [[0, 1, 1], [0, 0, 1]]
    assert sub.rewards.tolist() == [0.5, 0.0]
    assert sub.sample_uids == ["b#0", "a#1"]
    assert sequence_lengths(batch) == [5, 3, 3]


def test_micro_batches_fill_the_budget_longest_first():
    # Sorted: 8 (i2), 7 (i4), 5 (i0), 3 (i1), 2 (i3). [8, 7] pads to 2 x 8 = 16; adding 5 would be 24.
    assert plan_micro_batches([5, 3, 8, 2, 7], max_tokens=16) == [[2, 4], [0, 1, 3]]
    assert plan_micro_batches([5, 3, 8, 2, 7], max_tokens=8) == [[2], [4], [0], [1, 3]]
    assert plan_micro_batches([4, 4, 4], max_tokens=100) == [[0, 1, 2]]


def test_micro_batches_give_an_oversized_sample_its_own_batch():
    assert plan_micro_batches([20, 3, 3], max_tokens=10) == [[0], [1, 2]]
    assert plan_micro_batches([], max_tokens=10) == []


def test_micro_batches_cover_every_sample_once_within_budget():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        lengths = torch.randint(
            1, 40, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen
        ).tolist()
        budget = int(torch.randint(1, 120, (1,), generator=gen))
        plan = plan_micro_batches(lengths, budget)
        assert sorted(i for part in plan for i in part) == list(range(len(lengths)))
        for part in plan:
            assert len(part) == 1 or len(part) * max(lengths[i] for i in part) <= budget


def test_mini_batches_split_evenly_with_or_without_shuffle():
    assert plan_mini_batches(10, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    shuffled = plan_mini_batches(10, 2, torch.Generator().manual_seed(1))
    assert [len(p) for p in shuffled] == [5, 5]
    assert sorted(shuffled[0] + shuffled[1]) == list(range(10))
    assert shuffled == plan_mini_batches(10, 2, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="num_mini_batches must be in"):
        plan_mini_batches(2, 3)
