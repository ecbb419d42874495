"""Bytes a process's CPU tensor allocator holds over a region of code: its peak, and its level at named marks.

Why: memory claims about the trainer (sharded loading, sharded gradients) must be checked on CPU, where torch
keeps no allocator statistics like ``torch.cuda.max_memory_allocated``, and RSS counts the interpreter, shared
libraries, memory-mapped files and freed-but-kept pages. torch's profiler with ``profile_memory`` records every
allocation and free of its CPU allocator (storage resizes included, which FSDP2 uses to free gathered
parameters), so the running sum of those records is the tensor bytes held at each moment.

Limit: the profiler records allocations and frees only on the threads it profiles, so a tensor freed on
another thread (gloo's workers drop collectives' buffers) looks held to the end; ``heap_bytes_in_use`` reads
levels that count every thread.

Key decision: marks are profiler events too (``record_function``), so they sit on the same clock as the
allocations they are compared with. Levels are relative to the start of the region: what was allocated before
it counts as zero.
"""

from __future__ import annotations

import ctypes
from bisect import bisect_right
from itertools import accumulate
from types import TracebackType

from torch.profiler import ProfilerActivity, profile, record_function

_MARK = "asyncrl.allocated:"


class AllocatedBytes:
    """``with AllocatedBytes() as trace: ...`` then ``trace.peak`` and ``trace.at(name)``; ``trace.mark(name)``
    inside the region records the allocator's level at that point."""

    def __init__(self) -> None:
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._times: list[int] = []
        self._levels: list[int] = []
        self._marks: dict[str, list[int]] = {}

    def __enter__(self) -> AllocatedBytes:
        self._profile.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._profile.__exit__(kind, error, trace)
        memory: list[tuple[int, int]] = []
        for event in self._profile.profiler.kineto_results.events():
            name = event.name()
            if name == "[memory]":
                memory.append((event.start_ns(), event.nbytes()))
            elif name.startswith(_MARK):
                self._marks.setdefault(name.removeprefix(_MARK), []).append(event.start_ns())
        memory.sort()
        self._times = [time for time, _ in memory]
        self._levels = list(accumulate(nbytes for _, nbytes in memory))

    def mark(self, name: str) -> None:
        """Record the allocator's level here under ``name`` (a name marked again keeps every occurrence)."""
        with record_function(_MARK + name):
            pass

    @property
    def peak(self) -> int:
        """The most bytes held at any moment of the region, above its starting level."""
        return max([0, *self._levels])

    def at(self, name: str) -> list[int]:
        """The bytes held (above the starting level) at each time ``name`` was marked, in order."""
        if name not in self._marks:
            raise KeyError(f"no mark {name!r} in this region (marks: {sorted(self._marks)})")
        return [self._level_at(time) for time in sorted(self._marks[name])]

    def _level_at(self, time_ns: int) -> int:
        index = bisect_right(self._times, time_ns)
        return self._levels[index - 1] if index else 0


def heap_bytes_in_use() -> int:
    """Bytes glibc's malloc has handed out and not taken back, over every thread's arena and mmapped chunks.

    For levels that must count frees made on other threads (gloo's worker threads drop the last reference to
    a collective's buffers), which the profiler behind ``AllocatedBytes`` records only on its own threads.
    Tensors are most of it at the sizes measured; Python's own small objects come from the same heap.
    """
    info = _mallinfo2()
    return int(info.uordblks + info.hblkhd)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> _MallInfo2:
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        raise RuntimeError("heap_bytes_in_use needs glibc >= 2.33 (mallinfo2)")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()
