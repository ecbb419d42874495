"""How a mini-batch's rows are dealt out to data-parallel ranks: so that each rank computes about as many tokens.

Every rank builds the whole batch, so each computes the whole split itself, identically and with no
communication: it is a pure function of the rows' lengths, the world size and the micro-batch plan's settings.
Key decisions:

- The cost balanced is a rank's *planned tokens*: what its micro-batches compute as ``plan_micro_batches`` plans
  them, rows x longest row when padded, real tokens when packed. Padding is compute too, so balancing plain
  lengths would leave a padded rank's real cost unbalanced.
- Rows are dealt longest first (ties by position), each to the rank whose planned tokens it leaves smallest
  (ties by rank): longest-processing-time greedy. Dealt in that order, a rank's rows arrive in the very order
  ``plan_micro_batches`` takes them, so the cost tracked here is exactly its plan's (the tests hold it to that).
- Greedy is not optimal and can lose to a lucky strided split (every ``world_size``-th row), so the strided split
  is kept when its largest rank is smaller: the balanced split is never worse than the strided one it replaces.

Any split gives the same gradient (``normalisation``): this moves time between ranks, never the step's numbers
beyond float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RowSplit:
    """Which rows each rank trains, and what they cost it."""

    rows: tuple[int, ...]
    """The mini-batch's rows, as given."""
    ranks: tuple[tuple[int, ...], ...]
    """Rank r's rows, in their order in ``rows``; every row on exactly one rank."""
    tokens: tuple[int, ...]
    """Rank r's planned tokens: the sum over its micro-batches of rows x longest row (packed: real tokens)."""

    @property
    def imbalance(self) -> float:
        """The largest rank's planned tokens over the ranks' mean: 1.0 is even; every rank waits for the
        largest."""
        mean = sum(self.tokens) / len(self.tokens)
        return max(self.tokens) / mean if mean > 0 else 1.0


class _RankPlan:
    """One rank's micro-batch plan, grown one row at a time in ``plan_micro_batches``' order (longest first):
    the open micro-batch's longest row and row count (padded) or real tokens (packed), and the total so far."""

    def __init__(self, max_tokens: int, packed: bool) -> None:
        self.max_tokens = max_tokens
        self.packed = packed
        self.tokens = 0
        self.open_longest = 0
        self.open_rows = 0
        self.open_tokens = 0

    def cost_of(self, length: int) -> int:
        """Planned tokens this rank would add with a row of ``length`` (no longer than any it holds)."""
        if not self._fits(length):
            return length  # a new micro-batch, this row its longest
        return length if self.packed else self.open_longest  # padded: the row is padded to the longest

    def add(self, length: int) -> None:
        cost = self.cost_of(length)
        if not self._fits(length):
            self.open_longest, self.open_rows, self.open_tokens = length, 0, 0
        self.tokens += cost
        self.open_rows += 1
        self.open_tokens += length

    def _fits(self, length: int) -> bool:
        """The rule of ``plan_micro_batches``: one more row stays within the budget."""
        if self.open_rows == 0:
            return False
        if self.packed:
            return self.open_tokens + length <= self.max_tokens
        return (self.open_rows + 1) * self.open_longest <= self.max_tokens


def planned_tokens(lengths: Sequence[int], max_tokens: int, *, packed: bool) -> int:
    """What ``plan_micro_batches(lengths, max_tokens, packed=packed)`` makes a rank compute, in tokens."""
    plan = _RankPlan(max_tokens, packed)
    for length in sorted(lengths, reverse=True):
        plan.add(length)
    return plan.tokens


def strided_split(
    rows: Sequence[int], lengths: Sequence[int], world_size: int, max_tokens: int, *, packed: bool
) -> RowSplit:
    """Every ``world_size``-th row from position r to rank r: rows dealt by count, whatever their length."""
    _check(rows, lengths, world_size)
    positions = [tuple(range(rank, len(rows), world_size)) for rank in range(world_size)]
    return _split(rows, lengths, positions, max_tokens, packed)


def balanced_split(
    rows: Sequence[int], lengths: Sequence[int], world_size: int, max_tokens: int, *, packed: bool
) -> RowSplit:
    """Rows dealt so the ranks' planned tokens are balanced (see the module docstring); ``lengths[i]`` is the real
    length of ``rows[i]``. Never a larger largest rank than ``strided_split``; a rank may get no row."""
    _check(rows, lengths, world_size)
    plans = [_RankPlan(max_tokens, packed) for _ in range(world_size)]
    dealt: list[list[int]] = [[] for _ in range(world_size)]
    for position in sorted(range(len(rows)), key=lambda i: (-lengths[i], i)):
        length = lengths[position]
        rank = min(range(world_size), key=lambda r: (plans[r].tokens + plans[r].cost_of(length), r))
        plans[rank].add(length)
        dealt[rank].append(position)
    balanced = _split(rows, lengths, [tuple(sorted(p)) for p in dealt], max_tokens, packed)
    strided = strided_split(rows, lengths, world_size, max_tokens, packed=packed)
    return strided if max(strided.tokens) < max(balanced.tokens) else balanced


def _split(
    rows: Sequence[int],
    lengths: Sequence[int],
    positions: list[tuple[int, ...]],
    max_tokens: int,
    packed: bool,
) -> RowSplit:
    return RowSplit(
        rows=tuple(rows),
        ranks=tuple(tuple(rows[i] for i in rank) for rank in positions),
        tokens=tuple(
            planned_tokens([lengths[i] for i in rank], max_tokens, packed=packed) for rank in positions
        ),
    )


def _check(rows: Sequence[int], lengths: Sequence[int], world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(rows) != len(lengths):
        raise ValueError(f"one length per row: {len(rows)} rows, {len(lengths)} lengths")
