"""Wake-ups for waits on proxy state: a broadcast one, and a targeted one for held calls.

Why not ``asyncio.Condition``: notifying must be a plain synchronous call from any state change (a request
finishing, an update landing, ``close()``), with no lock to acquire; a fresh ``Event`` per generation of
state gives exactly that.

Why two: ``Wakeup`` re-checks every waiter on every change, which is right for a handful of waiters
(``update_applied``). Held generate calls can number thousands while changes come once per finished request;
re-checking each of them on each change made a large simulated cluster quadratic. ``HeldCalls`` wakes a call
only when its wait can have ended.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Hashable


class Wakeup:
    """``notify()`` wakes every ``wait_until(predicate)``; each returns once its predicate holds."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._num_waiting = 0

    def notify(self) -> None:
        if not self._num_waiting:  # nothing to wake: keep the event (notify runs once per finished request)
            return
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is evaluated now and after every ``notify()``."""
        while not predicate():
            self._num_waiting += 1
            try:
                await self._event.wait()
            finally:
                self._num_waiting -= 1


class HeldCalls:
    """Calls waiting until their predicate holds, woken only when it may hold.

    A *shared* waiter's predicate is true whenever the condition the notifier passes to ``notify`` is true
    (most held calls wait for the same thing: the proxy open and its best engine ready); it is not evaluated
    otherwise. When only some of them can move (``limit``: the free engine slots), ``notify`` wakes that many,
    minus those woken before that have not re-checked yet, so a change wakes O(free slots) calls, not every
    held one. Any other waiter has its predicate evaluated on every ``notify`` (calls pinned to a version or
    excluding engines: few). ``wake(key)`` wakes one waiter whatever its kind (an abort). A woken waiter
    re-checks its predicate and waits again if it no longer holds, keeping its place: shared waiters are woken
    in the order they first waited.
    """

    def __init__(self) -> None:
        self._shared: dict[Hashable, tuple[int, asyncio.Future[None]]] = {}
        self._order: list[tuple[int, Hashable]] = []
        """Heap of (ticket, key) over shared waiters; entries of waiters that left are skipped when popped."""
        self._own: dict[Hashable, tuple[Callable[[], bool], asyncio.Future[None]]] = {}
        self._tickets = itertools.count()
        self._woken: set[Hashable] = set()
        """Shared waiters ``notify`` woke that have not re-checked their predicate yet."""
        self.num_wakeups = 0
        """Waiters woken by ``notify`` so far (a count the tests bound per change)."""

    def __len__(self) -> int:
        return len(self._shared) + len(self._own)

    async def wait_until(self, key: Hashable, predicate: Callable[[], bool], *, shared: bool) -> None:
        """Wait until ``predicate()`` is true; ``key`` names the waiter for ``wake`` (unique among waiters)."""
        ticket = next(self._tickets)
        while not predicate():
            future = asyncio.get_running_loop().create_future()
            if shared:
                self._shared[key] = (ticket, future)
                heapq.heappush(self._order, (ticket, key))
            else:
                self._own[key] = (predicate, future)
            try:
                await future
            finally:
                self._shared.pop(key, None)
                self._own.pop(key, None)
                self._woken.discard(key)

    def notify(self, shared_condition: bool, limit: int | None = None) -> None:
        """State changed: if ``shared_condition``, wake the shared waiters (at most ``limit`` of them pending a
        re-check; None: all), and each other waiter whose predicate holds."""
        if shared_condition:
            self._wake_shared(len(self._shared) if limit is None else limit - len(self._woken))
        for key, (predicate, future) in list(self._own.items()):
            if predicate():
                del self._own[key]
                self.num_wakeups += 1
                _resolve(future)

    def _wake_shared(self, budget: int) -> None:
        """Wake up to ``budget`` shared waiters, oldest ticket first."""
        while budget > 0 and self._order:
            ticket, key = heapq.heappop(self._order)
            entry = self._shared.get(key)
            if entry is None or entry[0] != ticket:
                continue  # that waiter left (woken by ``wake``, cancelled) or already woken
            del self._shared[key]
            self._woken.add(key)
            self.num_wakeups += 1
            budget -= 1
            _resolve(entry[1])
        if len(self._order) > 2 * len(self._shared) + 16:  # drop the entries of waiters that left
            self._order = [(ticket, key) for key, (ticket, _) in self._shared.items()]
            heapq.heapify(self._order)

    def wake(self, key: Hashable) -> None:
        """Wake waiter ``key`` (if it waits) to re-check its predicate."""
        entry = self._shared.pop(key, None)
        future = None if entry is None else entry[1]
        if future is None and key in self._own:
            future = self._own.pop(key)[1]
        if future is not None:
            _resolve(future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
