"""Pause an ``AsyncEngine`` mid-request from its own step thread, for tests that act on a running request.

A test that polls, on its own loop, for a request's first tokens and then aborts, exports or pauses it races
the request's last token: the tiny test models decode a token a millisecond, and on a loaded CI box the test's
thread can be off the CPU for longer than the request has left, so the request finishes first and the test
fails. ``PauseAt`` pauses the engine on its step thread right after the step that took the request to a chosen
length, which leaves the request in flight, with its KV and its call unsettled, until the test acts, however
the threads are scheduled. Commands (abort, export, resume) still run on a paused engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.types import Generation


class PauseAt:
    """Pause the first engine that steps ``request_id`` to ``tokens`` output tokens (its prefix included)."""

    def __init__(self, engines: Sequence[AsyncEngine], request_id: str, tokens: int) -> None:
        """Watch every one of ``engines`` (a test over a proxy need not know which one serves the request).
        Install before the request can reach ``tokens``, i.e. before it is submitted."""
        self.request_id, self.tokens = request_id, tokens
        self._lock = threading.Lock()
        self._paused: AsyncEngine | None = None
        for engine in engines:
            engine.core.step = self._step_then_pause(engine)

    async def reached(self, timeout_s: float = 30.0) -> AsyncEngine:
        """The engine paused with the request in flight, once one is (it stays paused until the test resumes
        it; the watch pauses nothing again). ``TimeoutError`` after ``timeout_s``, e.g. when the request
        finished before reaching ``tokens``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._paused is None:
            if loop.time() > deadline:
                raise TimeoutError(
                    f"request {self.request_id!r} did not reach {self.tokens} tokens in {timeout_s} s"
                )
            await asyncio.sleep(0.001)
        return self._paused

    def _step_then_pause(self, engine: AsyncEngine) -> Callable[[], list[Generation]]:
        step = engine.core.step

        def step_then_pause() -> list[Generation]:
            finished = step()
            output = engine.core.output_so_far(self.request_id)
            if output is not None and len(output) >= self.tokens:
                with self._lock:
                    if self._paused is None:
                        engine.core.pause()
                        self._paused = engine
            return finished

        return step_then_pause
