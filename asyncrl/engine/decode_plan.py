"""Which rows of a decode step attend over how many KV positions (no torch).

Why: a decode batch holds rows whose contexts differ widely (in an RL rollout's long tail, one row at 2k
tokens beside sixty at 100). Attending every row over the batch's longest context makes the step's attention
cost rows × longest; splitting the rows into groups, each attending over its own length, makes it close to
the sum of the rows' own (bucketed) contexts.

The groups come from a ladder of KV-length levels: ``MIN_LENGTH_BUCKET`` doubling up to
``FINE_LENGTHS_FROM``, then half-octave steps (×1.5, ×4/3: 2,048, 3,072, 4,096, 6,144, …) up to the pool's
length. Row ``r`` needs ``needs[r]`` positions (its position + 1) and so the level
``length_bucket(needs[r])``. For each level ``L``, ``N(L)`` is one past the last row needing at least ``L``;
level ``L``'s group is rows ``[N(next level), N(L))``, every one of which needs at most ``L``. The groups tile
the batch in row order, the longest level first, and each group is one contiguous range of slots, so its keys
and values are views of the KV pool, never a gather. The plan is right for any row order; it is cheapest when
rows needing long contexts come first, which the scheduler keeps (``Scheduler._order_by_length``).

Each group attends with one plain softmax over its own positions, the same reduction as one row alone over a
padded length: no split-K, no log-sum-exp combine, so a row's attention sums in the same way as before and
only the masked-out padding past it changes.

Static shapes (CUDA graphs, ``static_shape``) pad the batch and round each ``N(L)`` up to the batch ladder
(1, 2, 3, 4, 6, 8, 12, 16, …: half-octave steps) and attend each group over its level, so a step's shape is
one of a few (batch, groups) keys; the dynamic path keeps the exact row counts and attends each group over its
longest row's own need. Why half octaves, not powers of two: the rows a level's rounded-up count takes in
(idle padding rows, or rows of lower levels) read at that level, and with powers of two the top group took up
to twice its rows (130 live rows at 16k read as 256 × 16,384) while each row read up to twice its context;
both compound on the step's dominant cost at long contexts. A finer ladder costs more distinct shapes, each a captured graph (capture time and memory, again at
every wake); the CPU simulation in ``asyncrl.testing.decode_rollouts`` measures both sides, and
docs/backends.md records the figures that chose this point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MIN_LENGTH_BUCKET = 64
"""Shortest KV-length bucket: below it the attention's cost is lost in the step's fixed cost."""

FINE_LENGTHS_FROM = 2048
"""KV length from which the levels step by half octaves instead of doubling: below it a row's KV read is
small beside the step's weights, and every extra level is one more shape to capture."""

Group = tuple[int, int, int]
"""(first row, one past the last row, KV positions attended) of one attention group."""


def half_octave_ceil(count: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, … (powers of two and one and a half times them) that is
    at least ``count``: rounding up by less than a factor 1.5."""
    if count < 1:
        raise ValueError(f"count {count} must be at least 1")
    power = 1
    while power < count:
        if power >= 2 and power * 3 // 2 >= count:
            return power * 3 // 2
        power *= 2
    return power


def batch_buckets(num_slots: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, … below ``num_slots``, then ``num_slots`` itself: every batch a step can have
    fits one."""
    buckets, size = [], 1
    while size < num_slots:
        buckets.append(size)
        size = half_octave_ceil(size + 1)
    return [*buckets, num_slots]


def length_bucket(length: int, max_len: int) -> int:
    """The KV length a row (or step) needing ``length`` positions attends over: the next power of two, at
    least ``MIN_LENGTH_BUCKET``, or above ``FINE_LENGTHS_FROM`` the next half-octave step (3,072, 4,096,
    6,144, …), at most ``max_len`` (the pool's real positions; the scratch one is never read)."""
    if not 1 <= length <= max_len:
        raise ValueError(f"decode length {length} is outside [1, {max_len}]")
    bucket = MIN_LENGTH_BUCKET
    while bucket < length:
        bucket *= 2
    if bucket > FINE_LENGTHS_FROM and bucket * 3 // 4 >= length:
        bucket = bucket * 3 // 4
    return min(bucket, max_len)


def length_levels(max_len: int) -> list[int]:
    """Every KV length ``length_bucket`` can return for a pool of ``max_len`` positions, ascending."""
    levels = [length_bucket(1, max_len)]
    while levels[-1] < max_len:
        levels.append(length_bucket(levels[-1] + 1, max_len))
    return levels


def attention_groups(
    needs: Sequence[int], max_len: int, *, pad_rows: Callable[[int], int] | None = None
) -> tuple[Group, ...]:
    """The groups tiling rows ``[0, len(needs))``, longest level first (module docstring).

    ``pad_rows`` (static shapes) rounds each level's row count up, monotonically and never past the batch;
    each group then attends over its whole level. Without it each group attends over its longest row's need.
    """
    batch = len(needs)
    if batch == 0:
        raise ValueError("a decode step needs at least one row")
    past_last = {}  # bucket -> one past the last row in it
    for row, need in enumerate(needs):
        past_last[length_bucket(need, max_len)] = row + 1
    groups = []
    end_of_longer = 0  # N(level) of the levels above, a running maximum
    for level in reversed(length_levels(max_len)):
        count = max(past_last.get(level, 0), end_of_longer)
        if count > end_of_longer and pad_rows is not None:
            count = min(pad_rows(count), batch)
        if count <= end_of_longer:
            continue
        length = level if pad_rows is not None else max(needs[end_of_longer:count])
        groups.append((end_of_longer, count, length))
        end_of_longer = count
    return tuple(groups)


def static_shape(
    positions: Sequence[int], buckets: Sequence[int], max_len: int
) -> tuple[int, tuple[Group, ...]]:
    """The (batch, attention groups) shape a static step over rows at ``positions`` runs at: the batch padded
    to the first of ``buckets`` (ascending, the last the slot count) that holds it, the padded rows idle (one
    position needed: they write to the scratch position), each level's row count rounded up the same ladder."""

    def bucket(rows: int) -> int:
        return next(b for b in buckets if b >= rows)

    batch = bucket(len(positions))
    needs = [position + 1 for position in positions] + [1] * (batch - len(positions))
    return batch, attention_groups(needs, max_len, pad_rows=bucket)


def attention_positions(groups: Sequence[Group]) -> int:
    """KV positions one layer's decode attention reads under ``groups``: the work this plan costs."""
    return sum((end - start) * length for start, end, length in groups)
