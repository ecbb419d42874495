"""A broadcast wake-up: waiters re-check their own condition whenever any proxy state changes.

Why not ``asyncio.Condition``: notifying must be a plain synchronous call from any state change (a request
finishing, an update landing, ``close()``), with no lock to acquire; a fresh ``Event`` per generation of
state gives exactly that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Wakeup:
    """``notify()`` wakes every ``wait_until(predicate)``; each returns once its predicate holds."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` is true; it is evaluated now and after every ``notify()``."""
        while not predicate():
            await self._event.wait()
