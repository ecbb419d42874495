"""A pool of numbered slots that coroutines on any event loop (and any thread) can wait for.

Why not ``asyncio.Semaphore``: it belongs to one event loop, while sandbox calls come both from the main
loop (tools in environments) and from reward threads that each run their own loop. The slot number picks
the uid a sandboxed program runs as.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque


class SlotPool:
    """``size`` slots; ``acquire`` waits (first come, first served) until one is free."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._free = deque(range(size))
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]] = deque()

    async def acquire(self) -> int:
        """A free slot number; give it back with ``release``."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free:
                return self._free.popleft()
            future: asyncio.Future[int] = loop.create_future()
            self._waiters.append((loop, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # handed a slot, then cancelled before resuming
                self.release(future.result())
            raise

    def release(self, slot: int) -> None:
        """Hand ``slot`` to the oldest waiter, or back to the free list."""
        with self._lock:
            if not self._waiters:
                self._free.append(slot)
                return
            loop, future = self._waiters.popleft()
        try:
            loop.call_soon_threadsafe(self._hand_over, future, slot)
        except RuntimeError:  # that waiter's loop is closed: it will never take the slot
            self.release(slot)

    def _hand_over(self, future: asyncio.Future[int], slot: int) -> None:
        if future.cancelled():  # the waiter gave up meanwhile: pass the slot on
            self.release(slot)
        else:
            future.set_result(slot)
