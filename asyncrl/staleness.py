"""Staleness arithmetic of the async ratio α: pure functions, so every bound is checked with exact numbers.

Terms. The trainer is *at version n* when its weights have received n updates; it then trains the
(n+1)-th batch and moves to version n+1. A group's *start version* is the policy version that began its
generation. One batch is ``B`` groups (prompts) of ``group_size`` samples each.

Freshness (per sample, strict). A group trained at version n must have been started at version
``>= n - α``. Its *policy age* ``n - start`` is therefore at most ``α``.

Admission (the capacity rule, SkyRL/AReaL form). A group admitted at version n can be trained fresh at
versions n .. n + ⌊α⌋, i.e. in the batches that bring the total trained to ``(n + ⌊α⌋ + 1)·B`` groups.
So at version n the number of groups ever admitted, minus those dropped without training, may not exceed::

    capacity(n) = (n + ⌊α⌋ + 1) · B   (+ any redundant slots the producer is granted)

With the trainer having consumed n batches (n·B groups) that leaves ``(⌊α⌋ + 1)·B`` groups in flight or
buffered: the bound on the buffer.

Fractional α, exactly. Versions are integers, so ``start >= n - α`` holds if and only if
``start >= n - ⌊α⌋``: only the integer part of α can change which samples are fresh. The admission window
uses the same ⌊α⌋, because a group admitted beyond ``(⌊α⌋ + 1)·B`` at version n could only be trained at
version ``n + ⌊α⌋ + 1`` or later, an age of ``⌊α⌋ + 1 > α``: it would be generated only to be reclaimed.
Hence α = 1.5 behaves exactly like α = 1, and α = 0.5 exactly like α = 0 (synchronous). The buffer then
holds at most ``(⌊α⌋ + 1)·B <= (1 + α)·B`` groups, which is the bound the ROLL Flash report states.
α = 0 is synchronous: capacity ``(n + 1)·B`` admits batch n+1 only once the version has reached n+1.

No straggler (deadline order). Admission alone does not stop a straggler: a slow group admitted at
version v can be overtaken by newer groups that fill the batches until v + ⌊α⌋ has passed. Its deadline is
``last_fresh_version = v + ⌊α⌋``. A trainer that takes a batch only when every group left behind can still
make its deadline (``latest_overdue_version`` is None) never sees one go stale: by induction, at the start
of step n at most ``(m - n + 1)·B`` live groups have a deadline ``<= m`` (admission caps the live groups at
``(⌊α⌋ + 1)·B``, and an earliest-deadline-first batch removes B of those due first), so once the older
groups have arrived the oldest-first batch is always acceptable, and waiting for them cannot deadlock.
Redundant admissions (R slots) break the count by up to R; the trainer does not wait for those, so up to
R redundant groups may still be reclaimed.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping


def max_policy_age(async_ratio: float) -> int:
    """The largest whole number of versions a trained sample may lag the trainer: ⌊α⌋."""
    if not math.isfinite(async_ratio) or async_ratio < 0:
        raise ValueError(f"async_ratio must be a finite number >= 0, got {async_ratio}")
    return math.floor(async_ratio)


def policy_age(start_version: int, trainer_version: int) -> int:
    """How many versions the trainer is ahead of the policy that started a sample."""
    if start_version > trainer_version:
        raise ValueError(
            f"a sample cannot start at version {start_version} after the trainer's version {trainer_version}"
        )
    return trainer_version - start_version


def min_fresh_version(trainer_version: int, async_ratio: float) -> int:
    """The oldest start version the trainer at ``trainer_version`` may still train on (never below 0)."""
    return max(0, trainer_version - max_policy_age(async_ratio))


def is_fresh(start_version: int, trainer_version: int, async_ratio: float) -> bool:
    """Whether a sample started at ``start_version`` may be trained at ``trainer_version`` (age <= α)."""
    return start_version >= min_fresh_version(trainer_version, async_ratio)


def num_versions_in_window(async_ratio: float) -> int:
    """How many policy versions may have started samples that are still trainable: ⌊α⌋ + 1."""
    return max_policy_age(async_ratio) + 1


def max_buffered_groups(async_ratio: float, groups_per_batch: int) -> int:
    """The most groups the buffer may hold at once: (⌊α⌋ + 1)·B, which is <= (1 + α)·B."""
    _check_batch(groups_per_batch)
    return num_versions_in_window(async_ratio) * groups_per_batch


def admission_capacity(
    trainer_version: int, async_ratio: float, groups_per_batch: int, num_redundant: int = 0
) -> int:
    """Groups that may have been admitted (less those dropped untrained) by the time of ``trainer_version``.

    ``(n + ⌊α⌋ + 1)·B + num_redundant``: every group admitted within it can still be trained fresh when
    the trainer consumes one batch of B groups per version; ``num_redundant`` extra slots let a producer
    over-start for dynamic filtering (the surplus is dropped, never trained stale).
    """
    _check_batch(groups_per_batch)
    if trainer_version < 0 or num_redundant < 0:
        raise ValueError(
            f"trainer_version and num_redundant must be >= 0, got {trainer_version}, {num_redundant}"
        )
    return (trainer_version + num_versions_in_window(async_ratio)) * groups_per_batch + num_redundant


def last_fresh_version(start_version: int, async_ratio: float) -> int:
    """The last trainer version that may still train a sample started at ``start_version``: its deadline."""
    return start_version + max_policy_age(async_ratio)


def latest_overdue_version(
    deadlines: Iterable[int], trainer_version: int, groups_per_batch: int, slack: int = 0
) -> int | None:
    """The latest version by which more groups fall due than the trainer can still take, or None.

    ``deadlines`` are the ``last_fresh_version`` of the groups left untrained once the batch at
    ``trainer_version`` is taken. The trainer takes B groups at each of the versions ``trainer_version + 1 ..
    m``, so every group is trained fresh (earliest deadline first) if and only if, for every m, at most
    ``(m - trainer_version)·B`` of them have a deadline ``<= m``. A group already due (deadline <= the
    trainer's version) is overdue at once. ``slack`` groups more are tolerated (redundant admissions, which
    may be reclaimed by design). Example, B = 1 at version 1: deadlines [2, 2] are overdue at 2.
    """
    return latest_overdue_version_of_counts(
        collections.Counter(deadlines), trainer_version, groups_per_batch, slack
    )


def latest_overdue_version_of_counts(
    counts: Mapping[int, int], trainer_version: int, groups_per_batch: int, slack: int = 0
) -> int | None:
    """``latest_overdue_version`` given how many groups have each deadline: O(distinct deadlines), for a
    caller that keeps the groups counted by version (the buffer tests it on every change)."""
    _check_batch(groups_per_batch)
    overdue, num_due = None, 0
    for deadline in sorted(counts):
        num_due += counts[deadline]
        if num_due > max(0, deadline - trainer_version) * groups_per_batch + slack:
            overdue = deadline
    return overdue


def num_admittable(capacity: int, num_trained: int, num_live: int) -> int:
    """How many more groups may be admitted now: the capacity left after trained and live (unfinished) ones."""
    return max(0, capacity - num_trained - num_live)


def staleness_histogram(start_versions: Iterable[int], trainer_version: int) -> dict[int, int]:
    """How many samples of a batch trained at ``trainer_version`` have each policy age, ages ascending."""
    ages = collections.Counter(policy_age(start, trainer_version) for start in start_versions)
    return dict(sorted(ages.items()))


def _check_batch(groups_per_batch: int) -> None:
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
