"""Rows dealt to ranks by planned tokens: a partition of the mini-batch, never a larger largest rank than the
strided split, each rank's cost exactly its ``plan_micro_batches`` plan's, and a pure function of its inputs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.trainer.batching import plan_micro_batches
from asyncrl.trainer.distributed.row_split import balanced_split, planned_tokens, strided_split

LONG_TAILED = st.one_of(st.integers(1, 600), st.integers(1, 20_000))
"""Mostly short rows, some up to a 20k-token tail (each draw picks one of the two ranges)."""


def _plan_cost(lengths: list[int], max_tokens: int, packed: bool) -> int:
    """What the trainer's own planner makes a rank compute: rows x longest row, or real tokens packed."""
    plan = plan_micro_batches(lengths, max_tokens, packed=packed)
    if packed:
        return sum(lengths)
    return sum(len(micro) * max(lengths[i] for i in micro) for micro in plan)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(LONG_TAILED, min_size=1, max_size=80),
    world_size=st.integers(1, 8),
    max_tokens=st.sampled_from([512, 4096, 32_768]),
    packed=st.booleans(),
    seed=st.randoms(use_true_random=False),
)
def test_balanced_split_partitions_rows_and_never_loses_to_strided(
    lengths, world_size, max_tokens, packed, seed
):
    rows = list(range(100, 100 + len(lengths)))
    seed.shuffle(rows)  # a shuffled mini-batch's row ids
    split = balanced_split(rows, lengths, world_size, max_tokens, packed=packed)
    strided = strided_split(rows, lengths, world_size, max_tokens, packed=packed)

    assert len(split.ranks) == world_size
    assert sorted(row for rank in split.ranks for row in rank) == sorted(rows)  # each row on exactly one rank
    for rank in split.ranks:  # in the mini-batch's order
        assert list(rank) == [row for row in rows if row in rank]
    assert max(split.tokens) <= max(strided.tokens)
    length_of = dict(zip(rows, lengths, strict=True))
    for rank, tokens in zip(split.ranks, split.tokens, strict=True):
        assert tokens == _plan_cost([length_of[row] for row in rank], max_tokens, packed)
    # Every rank computes the split from the same inputs alone: again, it is the same split.
    assert balanced_split(list(rows), list(lengths), world_size, max_tokens, packed=packed) == split


def test_a_long_row_gets_a_rank_to_itself_where_strided_stacks_it():
    """Packed, one budget-sized micro-batch: longest first, each row to the rank it leaves smallest (ties to the
    lower rank). Strided puts the four long rows on rank 0."""
    lengths = [9, 1, 8, 1, 7, 1, 6, 1]
    rows = list(range(8))
    strided = strided_split(rows, lengths, 2, 100, packed=True)
    assert strided.ranks == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert strided.tokens == (30, 4)
    assert strided.imbalance == pytest.approx(30 / 17)

    split = balanced_split(rows, lengths, 2, 100, packed=True)
    # 9 -> r0, 8 -> r1, 7 -> r1 (15 < 16), 6 -> r0 (15 < 21), then the 1s alternate from r0.
    assert split.ranks == ((0, 1, 5, 6), (2, 3, 4, 7))
    assert split.tokens == (17, 17)
    assert split.imbalance == 1.0


def test_padded_cost_counts_padding():
    """Padded: a micro-batch costs rows x its longest row, so a short row beside a long one costs the long one."""
    assert planned_tokens([10, 4, 4], 30, packed=False) == 30  # one micro-batch of 3 x 10
    assert planned_tokens([10, 4, 4], 20, packed=False) == 20 + 4  # [10, 4] padded to 10, then [4]
    assert planned_tokens([10, 4, 4], 20, packed=True) == 18
    assert planned_tokens([], 20, packed=False) == 0


def test_padded_balance_counts_the_padding_a_row_would_get():
    """Padded, budget 20: the last 5-token row would cost rank 0 10 (padded to its open micro-batch's 10-token
    row) and rank 1 6, so it goes to rank 1; balancing real tokens (packed) puts it on rank 0, which padded
    would compute 20 tokens."""
    padded = balanced_split([0, 1, 2, 3], [10, 6, 5, 5], 2, 20, packed=False)
    assert padded.ranks == ((0,), (1, 2, 3))
    assert padded.tokens == (10, 18)
    packed = balanced_split([0, 1, 2, 3], [10, 6, 5, 5], 2, 20, packed=True)
    assert packed.ranks == ((0, 3), (1, 2))
    assert packed.tokens == (15, 11)
    assert planned_tokens([10, 5], 20, packed=False) == 20


def test_strided_split_is_kept_where_greedy_loses_to_it():
    """[3, 3, 2, 2, 2] is greedy's classic loss (7 where 6 exists); in this order strided finds the 6."""
    lengths = [2, 3, 2, 3, 2]
    strided = strided_split(range(5), lengths, 2, 100, packed=True)
    assert strided.tokens == (6, 6)
    assert balanced_split(list(range(5)), lengths, 2, 100, packed=True) == strided


def test_more_ranks_than_rows_leaves_ranks_empty():
    split = balanced_split([5, 6], [3, 7], 3, 100, packed=True)
    assert split.ranks == ((6,), (5,), ())
    assert split.tokens == (7, 3, 0)
    assert split.imbalance == pytest.approx(7 / (10 / 3))


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        balanced_split([0], [3], 0, 100, packed=True)
    with pytest.raises(ValueError, match="one length per row: 2 rows, 1 lengths"):
        balanced_split([0, 1], [3], 2, 100, packed=True)
