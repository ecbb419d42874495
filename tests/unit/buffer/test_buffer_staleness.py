"""Exact values of the staleness arithmetic, including fractional async ratios."""

import pytest

from asyncrl import staleness


@pytest.mark.parametrize(
    ("alpha", "expected"), [(0, 0), (0.5, 0), (0.999, 0), (1, 1), (1.5, 1), (2, 2), (7.25, 7)]
)
def test_max_policy_age_is_the_integer_part_of_alpha(alpha, expected):
    assert staleness.max_policy_age(alpha) == expected


@pytest.mark.parametrize("alpha", [-0.1, float("inf"), float("nan")])
def test_max_policy_age_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError, match="async_ratio"):
        staleness.max_policy_age(alpha)


def test_policy_age():
    assert staleness.policy_age(3, 3) == 0
    assert staleness.policy_age(1, 4) == 3
    with pytest.raises(ValueError, match="cannot start at version 5"):
        staleness.policy_age(5, 4)


@pytest.mark.parametrize(
    ("trainer_version", "alpha", "expected"),
    [(0, 0, 0), (5, 0, 5), (5, 1, 4), (5, 1.5, 4), (5, 0.5, 5), (5, 2, 3), (1, 2, 0), (0, 3, 0)],
)
def test_min_fresh_version(trainer_version, alpha, expected):
    assert staleness.min_fresh_version(trainer_version, alpha) == expected


def test_is_fresh_at_the_boundary():
    # trainer at 5, alpha 2: started at 3 is exactly age 2 (fresh), 2 is age 3 (stale)
    assert staleness.is_fresh(3, 5, 2)
    assert not staleness.is_fresh(2, 5, 2)
    # fractional: age 1 > 0.5, so version 4 is stale at 5; 1.5 admits exactly age 1
    assert not staleness.is_fresh(4, 5, 0.5)
    assert staleness.is_fresh(4, 5, 1.5)
    assert not staleness.is_fresh(3, 5, 1.5)


def test_window_and_buffer_bound():
    assert staleness.num_versions_in_window(0) == 1
    assert staleness.num_versions_in_window(2.5) == 3
    # B = 4 groups: alpha 0 -> 4, alpha 1 -> 8, alpha 1.5 -> 8 (<= (1 + 1.5) * 4 = 10), alpha 0.5 -> 4
    assert [staleness.max_buffered_groups(a, 4) for a in (0, 1, 1.5, 0.5)] == [4, 8, 8, 4]
    with pytest.raises(ValueError, match="groups_per_batch"):
        staleness.max_buffered_groups(1, 0)


@pytest.mark.parametrize(
    ("version", "alpha", "batch", "redundant", "expected"),
    [
        (0, 0, 4, 0, 4),  # sync: only batch 0 at version 0
        (3, 0, 4, 0, 16),  # sync: batch 3 may start once the version is 3
        (0, 1, 4, 0, 8),  # one step ahead
        (2, 2, 3, 0, 15),  # (2 + 2 + 1) * 3
        (2, 2.9, 3, 0, 15),  # fractional part ignored
        (1, 0, 4, 2, 10),  # two redundant slots on top
    ],
)
def test_admission_capacity(version, alpha, batch, redundant, expected):
    assert staleness.admission_capacity(version, alpha, batch, redundant) == expected


def test_admission_capacity_rejects_negative_inputs():
    with pytest.raises(ValueError, match="trainer_version"):
        staleness.admission_capacity(-1, 0, 4)
    with pytest.raises(ValueError, match="num_redundant"):
        staleness.admission_capacity(0, 0, 4, -1)


def test_num_admittable():
    assert staleness.num_admittable(capacity=8, num_trained=4, num_live=3) == 1
    assert staleness.num_admittable(capacity=8, num_trained=4, num_live=4) == 0
    assert staleness.num_admittable(capacity=8, num_trained=4, num_live=6) == 0


def test_staleness_histogram():
    assert staleness.staleness_histogram([5, 3, 5, 4, 3, 3], trainer_version=5) == {0: 2, 1: 1, 2: 3}
    assert staleness.staleness_histogram([], trainer_version=2) == {}


def test_last_fresh_version_is_the_start_plus_the_integer_part_of_alpha():
    assert [staleness.last_fresh_version(3, a) for a in (0, 0.5, 1, 2.9)] == [3, 3, 4, 5]


@pytest.mark.parametrize(
    ("deadlines", "version", "batch", "slack", "expected"),
    [
        ([], 0, 1, 0, None),
        ([2, 2], 1, 1, 0, 2),  # two due by v2, but only the batch at v2 is left before it
        ([2, 3], 1, 1, 0, None),  # one per remaining batch
        ([2, 2, 3, 3], 1, 2, 0, None),  # B = 2: 2 by v2, 4 by v3
        ([2, 2, 3, 3, 3], 1, 2, 0, 3),
        ([1], 1, 4, 0, 1),  # due now but left behind: overdue at once
        ([2, 2, 4, 4, 4], 1, 1, 0, 4),  # the latest violation: 5 due by v4, only 3 batches left
        ([2, 2], 1, 1, 1, None),  # one redundant group may be reclaimed
    ],
)
def test_latest_overdue_version(deadlines, version, batch, slack, expected):
    assert staleness.latest_overdue_version(deadlines, version, batch, slack) == expected
