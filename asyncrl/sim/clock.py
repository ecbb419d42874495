"""The virtual clock: an asyncio loop whose time jumps to the next timer, and which can shuffle ready callbacks.

The simulator runs the real producers, buffer and controller on it; tests use it (through ``asyncrl.testing``)
to explore interleavings. It lives under ``sim/`` so the simulator depends on no test tooling.

Why: the default loop runs ready callbacks first-in first-out, which hides races that any other legal order
exposes (a snapshot-await-remove race failed 0/1000 seeds FIFO and 508/1000 shuffled). Shuffling the ready
queue before every iteration, from a seeded RNG, explores those orders reproducibly. The virtual clock makes
``loop.time()`` jump to the next timer whenever nothing is ready, so a 10-minute timeout takes microseconds
and a schedule of sleeps runs identically every time. Deadlock detection turns "nothing can ever wake this
loop" into an immediate ``DeadlockError`` instead of a hung test.

Built on CPython's ``BaseEventLoop._run_once`` internals (``_ready``, ``_scheduled``), stable from 3.8 to 3.13.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


class DeadlockError(RuntimeError):
    """No callback is ready, no timer is pending and no I/O or thread can wake the loop: it would hang."""


class ScheduleFailure(AssertionError):
    """A scenario failed under one seed; the message names the seed so the schedule can be replayed."""


class ShuffledEventLoop(asyncio.SelectorEventLoop):
    """Selector loop that shuffles ready callbacks with ``random.Random(seed)`` (None keeps FIFO order).

    ``virtual_time``: ``time()`` starts at 0 and advances only by jumping to the earliest timer when no
    callback is ready; code must wait on timers and futures, not on real I/O or wall-clock progress.
    ``detect_deadlock``: raise ``DeadlockError`` when nothing is ready or scheduled, only the loop's own
    wake-up pipe is registered and no default executor exists (so no thread can call back).
    """

    def __init__(
        self, seed: int | None = None, *, virtual_time: bool = False, detect_deadlock: bool = True
    ) -> None:
        self._rng = None if seed is None else random.Random(seed)
        self._virtual_time = virtual_time
        self._virtual_now = 0.0
        self._detect_deadlock = detect_deadlock
        super().__init__()

    def time(self) -> float:
        return self._virtual_now if self._virtual_time else super().time()

    def _run_once(self) -> None:
        self._pop_cancelled_timers()
        if not self._ready and not self._stopping:
            self._check_deadlock()
            if self._virtual_time and self._scheduled:
                self._virtual_now = max(self._virtual_now, self._scheduled[0]._when)
        if self._rng is not None:
            self._move_due_timers()
            # popped one by one, never copied and cleared: a thread's call_soon_threadsafe may append meanwhile,
            # and what it appends stays queued (after the shuffled ones) instead of being cleared away
            ready = [self._ready.popleft() for _ in range(len(self._ready))]
            self._rng.shuffle(ready)
            self._ready.extendleft(reversed(ready))
        if self._virtual_time and self._ready and not self._debug:
            self._run_ready()
        else:
            super()._run_once()

    def _run_ready(self) -> None:
        """One iteration of the base loop without its I/O poll (a system call and a few per cent of a large
        simulation's time): under virtual time nothing waits on I/O, and the base iteration, with its poll,
        runs whenever the ready queue is empty, so callbacks from threads and sockets still arrive."""
        self._move_due_timers()
        for _ in range(len(self._ready)):
            handle = self._ready.popleft()
            if not handle._cancelled:
                handle._run()

    def _pop_cancelled_timers(self) -> None:
        """Drop cancelled timers from the heap's head, as the base loop does, so the head is a live timer."""
        while self._scheduled and self._scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(self._scheduled)._scheduled = False

    def _move_due_timers(self) -> None:
        """Move due timers to the ready queue now, so they are shuffled with the other ready callbacks."""
        end_time = self.time() + self._clock_resolution
        while self._scheduled and self._scheduled[0]._when < end_time:
            handle = heapq.heappop(self._scheduled)
            handle._scheduled = False
            self._ready.append(handle)

    def _check_deadlock(self) -> None:
        if not self._detect_deadlock or self._scheduled:
            return
        only_self_pipe = len(self._selector.get_map()) <= 1
        if only_self_pipe and self._default_executor is None:
            raise DeadlockError(
                f"event loop deadlock at t={self.time():.3f}: no callback is ready, no timer is pending and "
                f"nothing can wake the loop; pending tasks: {_describe_tasks(self)}"
            )


def run_shuffled(main: Callable[[], Awaitable[T]], seed: int | None, *, virtual_time: bool = True) -> T:
    """Run ``main()`` to completion on a fresh ``ShuffledEventLoop``; leftover tasks are cancelled after."""
    loop = ShuffledEventLoop(seed, virtual_time=virtual_time)
    try:
        return loop.run_until_complete(main())
    finally:
        _cancel_leftover_tasks(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def run_seeds(
    scenario: Callable[[int], Awaitable[object]], seeds: Iterable[int], *, virtual_time: bool = True
) -> int:
    """Run ``scenario(seed)`` once per seed on a loop shuffled by that seed; returns how many ran.

    The first failure is re-raised as ``ScheduleFailure`` naming the seed, so ``run_shuffled`` replays it.
    """
    count = 0
    for seed in seeds:
        try:
            run_shuffled(lambda seed=seed: scenario(seed), seed, virtual_time=virtual_time)
        except Exception as error:
            raise ScheduleFailure(
                f"scenario failed under seed {seed}: {type(error).__name__}: {error}"
            ) from error
        count += 1
    return count


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def _describe_tasks(loop: asyncio.AbstractEventLoop) -> str:
    names = sorted(task.get_name() for task in asyncio.all_tasks(loop) if not task.done())
    return ", ".join(names) or "none"
