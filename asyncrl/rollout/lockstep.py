"""A barrier whose party changes as episodes end: the ``batch`` env-stepping baseline's synchronisation."""

from __future__ import annotations

import asyncio


class Lockstep:
    """Every joined member waits in ``wait()`` until all current members have arrived; ``leave()`` removes
    a member (an ended episode) and may release the others. Members must call ``wait()`` equally often."""

    def __init__(self) -> None:
        self._members = 0
        self._arrived = 0
        self._gate: asyncio.Future[None] | None = None

    def join(self) -> None:
        self._members += 1

    def leave(self) -> None:
        self._members -= 1
        self._release_if_all_arrived()

    async def wait(self) -> None:
        if self._gate is None:
            self._gate = asyncio.get_running_loop().create_future()
        gate = self._gate
        self._arrived += 1
        self._release_if_all_arrived()
        await gate

    def _release_if_all_arrived(self) -> None:
        if self._gate is not None and self._arrived >= self._members:
            gate, self._gate, self._arrived = self._gate, None, 0
            gate.set_result(None)
