"""A run-length-encoded read-only sequence (``RleSequence``) stored as parts: literal stretches and runs of one repeated value.

Why: some per-token sequences are runs by construction and thousands long. A loss mask is zeros over the
prompt then ones over the response; a simulated response's tokens, log-probs and versions carry no
information (one token id, one log-prob, a version that changes only at weight updates). As lists, the
producer, buffer and controller would build, copy and free them for every request: a sixth of a large
simulation's instructions, more of its time. ``RleSequence`` keeps them in O(parts) memory and joins them in O(parts) time, while behaving as
the ``Sequence`` the rest of the code expects: ``len``, indexing, iteration, equality with lists, pickling,
and ``list + runs`` (Python tries ``RleSequence.__radd__`` because ``list.__add__`` refuses a non-list). Code that
needs a list or a tensor converts with ``list(runs)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class RleSequence(Sequence[T], Generic[T]):
    """Immutable concatenation of parts, each a tuple of literal values or a ``(value, count)`` run.

    Parts are few (a prompt, then one run per weight version), so lookups walk them in order.
    """

    __slots__ = ("_parts", "_len")

    def __init__(self, values: Sequence[T] = ()) -> None:
        """``values`` (copied) as one literal part."""
        self._parts: tuple[Sequence[T], ...] = _parts_of(values)
        self._len = len(values)

    @classmethod
    def _joined(cls, parts: tuple[Sequence[T], ...], length: int) -> RleSequence[T]:
        """A ``RleSequence`` of ``parts`` whose total length the caller already knows (joins are the hot path)."""
        runs = object.__new__(cls)
        runs._parts, runs._len = parts, length
        return runs

    @classmethod
    def repeat(cls, value: T, count: int) -> RleSequence[T]:
        """``count`` times ``value``."""
        return cls._joined((_Repeat(value, count),), count)

    @classmethod
    def from_runs(cls, runs: Iterable[Sequence[Any]]) -> RleSequence[T]:
        """The ``(value, count)`` runs in order."""
        parts = tuple([_Repeat(value, count) for value, count in runs])
        return cls._joined(parts, sum([part.count for part in parts]))

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
            raise IndexError("RleSequence index out of range")
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

    def __add__(self, other: Sequence[T]) -> RleSequence[T]:
        return RleSequence._joined(self._parts + _parts_of(other), self._len + len(other))

    def __radd__(self, other: Sequence[T]) -> RleSequence[T]:
        return RleSequence._joined(_parts_of(other) + self._parts, len(other) + self._len)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __repr__(self) -> str:
        return f"RleSequence({list(self._parts)!r})"


def kept(values: Sequence[T]) -> Sequence[T]:
    """``values`` in a form the caller may keep: a ``RleSequence`` as itself (immutable, and copying it into a
    list would cost O(tokens): a simulated prompt or a partial response thousands long), anything else copied
    into a list (so a list the caller goes on mutating cannot change it)."""
    return values if type(values) is RleSequence else list(values)


def starts_with(values: Sequence[T], prefix: Sequence[T]) -> bool:
    """Whether ``values`` begins with ``prefix``: O(parts) when ``values`` was joined onto ``prefix`` (a
    continued request's output starts with the very parts of the prefix it was given), else item by item."""
    if type(values) is RleSequence and type(prefix) is RleSequence:
        head = values._parts[: len(prefix._parts)]
        if len(head) == len(prefix._parts) and all(a is b for a, b in zip(head, prefix._parts, strict=True)):
            return True
    return values[: len(prefix)] == prefix


def _parts_of(values: Sequence[T]) -> tuple[Sequence[T], ...]:
    """The parts of ``values``: its own if it is a ``RleSequence``, else one part copied into a tuple (so a list
    the caller goes on mutating cannot change this sequence); none if it is empty.

    ``type(...) is``, not ``isinstance``: ``RleSequence`` is an ABC, and its instance check costs a microsecond."""
    if type(values) is RleSequence:
        return values._parts
    return (tuple(values),) if len(values) else ()


class _Repeat(Sequence[T], Generic[T]):
    """``count`` copies of ``value`` (a part of ``RleSequence``)."""

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
