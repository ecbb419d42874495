"""A read-only token sequence stored as parts: literal stretches and runs of one repeated value.

Why: a simulated response's per-token fields carry no information (every token id is ``TOKEN_ID``, every
log-prob ``TOKEN_LOGPROB``, versions change only at weight updates), yet they run to thousands of entries and
the producer, buffer and controller would copy, sum and free them for every one of the hundreds of thousands
of requests of a large simulation. ``Runs`` keeps them in O(parts) memory and joins them in O(parts) time,
while behaving as the ``Sequence`` the real code expects: ``len``, indexing, iteration, equality with lists,
and ``list + runs`` (the producer's concatenation; Python tries ``Runs.__radd__`` because ``list.__add__``
refuses a non-list), so the scheduling code the simulator drives is unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Runs(Sequence[T], Generic[T]):
    """Immutable concatenation of parts, each a tuple of literal values or a ``(value, count)`` run.

    Parts are few (a prompt, then one run per weight version), so lookups walk them in order.
    """

    __slots__ = ("_parts", "_len")

    def __init__(self, parts: Iterable[Sequence[T]] = ()) -> None:
        self._parts: tuple[Sequence[T], ...] = tuple(parts)
        self._len = sum(map(len, self._parts))

    @classmethod
    def repeat(cls, value: T, count: int) -> Runs[T]:
        """``count`` times ``value``."""
        return cls((_Repeat(value, count),))

    @classmethod
    def from_runs(cls, runs: Iterable[Sequence[Any]]) -> Runs[T]:
        """The ``(value, count)`` runs in order."""
        return cls([_Repeat(value, count) for value, count in runs])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        """An element, or a slice as a new list (callers compare slices with lists)."""
        if isinstance(index, slice):
            return self._slice(index)
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("Runs index out of range")
        for part in self._parts:
            if index < len(part):
                return part[index]
            index -= len(part)
        raise AssertionError("unreachable: the parts' lengths sum to len(self)")

    def _slice(self, index: slice) -> list[T]:
        start, stop, step = index.indices(self._len)
        if step != 1:
            return list(self)[index]
        out: list[T] = []
        part_start = 0
        for part in self._parts:
            part_end = part_start + len(part)
            if part_end > start and part_start < stop:
                out += part[max(start - part_start, 0) : min(stop, part_end) - part_start]
            part_start = part_end
        return out

    def __iter__(self) -> Iterator[T]:
        for part in self._parts:
            yield from part

    def __add__(self, other: Sequence[T]) -> Runs[T]:
        return Runs(self._parts + _parts_of(other))

    def __radd__(self, other: Sequence[T]) -> Runs[T]:
        return Runs(_parts_of(other) + self._parts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"Runs({list(self._parts)!r})"


def _parts_of(values: Sequence[T]) -> tuple[Sequence[T], ...]:
    """The parts of ``values``: its own if it is a ``Runs``, else one part copied into a tuple (so a list
    the caller goes on mutating cannot change this sequence)."""
    return values._parts if isinstance(values, Runs) else (tuple(values),)


class _Repeat(Sequence[T], Generic[T]):
    """``count`` copies of ``value`` (a part of ``Runs``)."""

    __slots__ = ("value", "count")

    def __init__(self, value: T, count: int) -> None:
        if count < 0:
            raise ValueError(f"a run needs count >= 0, got {count}")
        self.value = value
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.value] * len(range(*index.indices(self.count)))
        if not -self.count <= index < self.count:
            raise IndexError("run index out of range")
        return self.value

    def __iter__(self) -> Iterator[T]:
        return itertools.repeat(self.value, self.count)

    def __repr__(self) -> str:
        return f"({self.value!r}, {self.count})"
