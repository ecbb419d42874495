"""Turns on one device between CUDA graph captures and a trainer in the same process (the inline runtime).

Why: while any capture is underway on a device, PyTorch's caching allocator skips its last resort when an
allocation does not fit, freeing every cached block and retrying (``CUDACachingAllocator.cpp``, ``malloc``:
``C10_LIKELY(captures_underway.empty()) && release_cached_blocks(...)``), so an allocation of the trainer's
that would have fit after that raises an out-of-memory error instead, which ends an inline run. The allocator
is the process's, so this holds whatever streams or threads the two use.

Key decision: a capture never waits, the trainer does. A capture takes its turn only when it is free
(``capture_turn``); otherwise the step decodes eagerly at its static shape and the capture is tried again at a
later step (``StaticDecode``), so an engine never stalls for a training step (seconds). The trainer holds its
turn around each call it runs on the device (``trainer_turn``), waiting for a capture underway (a capture is
short: a few decode steps) within ``timeout_s``. Decode replays and eager steps take no turn: they overlap
training as before.

Invariant (tests/unit/runtime/test_capture_turns.py, random schedules of a trainer and an engine thread): no
capture runs while a trainer call runs, in the same process on the same device.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CaptureTurnTimeout(TimeoutError):
    """The trainer waited past its deadline for a CUDA graph capture to end."""


class CaptureTurns:
    """Who may use the device's allocator exclusively now: a capture or the trainer, never both. One per
    process and device, shared by the trainer and every engine there (and their replacements)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        """How long the trainer waits for a capture underway (``runtime.control_timeout_s``)."""
        self._lock = threading.Lock()

    @contextmanager
    def capture_turn(self) -> Iterator[bool]:
        """Whether a capture may run now: True, the turn held until the block ends, unless the trainer holds
        it (False: capture later, never wait)."""
        taken = self._lock.acquire(blocking=False)
        try:
            yield taken
        finally:
            if taken:
                self._lock.release()

    @contextmanager
    def trainer_turn(self) -> Iterator[None]:
        """The device for a trainer call: held until the block ends, once a capture underway has ended
        (``CaptureTurnTimeout`` past ``timeout_s``)."""
        if not self._lock.acquire(timeout=self.timeout_s):
            raise CaptureTurnTimeout(
                f"the trainer waited runtime.control_timeout_s={self.timeout_s} s for an engine's CUDA graph "
                "capture on its device to end"
            )
        try:
            yield
        finally:
            self._lock.release()
