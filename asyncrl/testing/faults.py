"""Faults injected at the seams of a real run, for the fault-injection tests and the soak benchmark: an engine
that dies or wedges on command, and a reward that raises or hangs for chosen samples.

Each fault is what the real worker does, seen from the caller: a dead engine fails every call at once (Ray's
``ActorDiedError``), a wedged one is alive but answers nothing (its calls, health probe included, never
return), a bad reward raises or never returns. Every hang ends when the caller cancels, so nothing outlives
a test.
"""

from __future__ import annotations

import asyncio
import enum
import threading
from collections.abc import Callable
from typing import Any

from asyncrl.data.base import TaskSample
from asyncrl.testing.fake_engine import EngineDied
from asyncrl.types import Generation, Request


class EngineFault(enum.Enum):
    """What a ``FaultyEngine`` does now: ok → dead | wedged (once faulted, it stays so)."""

    OK = "ok"
    DEAD = "dead"
    WEDGED = "wedged"


class FaultyEngine:
    """An engine client passed through until ``kill()`` or ``wedge()``; from then on every call, including
    those already in flight, raises ``EngineDied`` (dead) or never returns (wedged).

    ``generating`` is set whenever a request starts on it, ``updating`` when a weight update starts and
    ``updated`` once it took one, so a test can fault it mid-generation, mid-update or after an update without
    sleeping (clear an event to wait for the next time). ``slow_next_update(s)`` makes the next update take
    ``s`` seconds more, answering no abort (the health probe) meanwhile, as a worker that serves one command at
    a time does. The wrapped engine's own work is cancelled when faulted, and ``shutdown`` reaches it.
    """

    def __init__(self, engine: Any, name: str) -> None:
        self.engine = engine
        self.name = name
        self.fault = EngineFault.OK
        self.generating = asyncio.Event()
        self.updating = asyncio.Event()
        self.updated = asyncio.Event()
        self._faulted = asyncio.Event()
        self._slow_update_s = 0.0
        self._busy: asyncio.Lock | None = None

    def slow_next_update(self, seconds: float) -> None:
        self._slow_update_s = seconds

    def _busy_lock(self) -> asyncio.Lock:
        self._busy = self._busy or asyncio.Lock()
        return self._busy

    def kill(self) -> None:
        self._set(EngineFault.DEAD)

    def wedge(self) -> None:
        self._set(EngineFault.WEDGED)

    def _set(self, fault: EngineFault) -> None:
        if self.fault is EngineFault.OK:
            self.fault = fault
            self._faulted.set()

    async def generate(self, request: Request) -> Generation:
        self.generating.set()
        return await self._call(self.engine.generate(request), f"generate({request.request_id})")

    async def abort(self, request_id: str) -> Generation | None:
        async with self._busy_lock():  # held by a slowed update
            return await self._call(self.engine.abort(request_id), f"abort({request_id})")

    async def pause(self) -> None:
        await self._call(self.engine.pause(), "pause")

    async def resume(self) -> None:
        await self._call(self.engine.resume(), "resume")

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        self.updating.set()
        async with self._busy_lock():
            delay, self._slow_update_s = self._slow_update_s, 0.0
            what = f"update_weights(v{version})"
            apply = lambda: self.engine.update_weights(named_tensors, version)  # noqa: E731 (started after the delay)
            await self._call(self._delayed(delay, apply), what)
        self.updated.set()

    @staticmethod
    async def _delayed(delay: float, call: Callable[[], Any]) -> Any:
        if delay:
            await asyncio.sleep(delay)
        return await call()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.engine.shutdown(*args, **kwargs)

    async def _call(self, call: Any, what: str) -> Any:
        inner = asyncio.ensure_future(call)
        faulted = asyncio.ensure_future(self._faulted.wait())
        try:
            await asyncio.wait({inner, faulted}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            inner.cancel()  # the caller gave up: so does the engine
            raise
        finally:
            faulted.cancel()
        if self.fault is not EngineFault.OK:
            inner.cancel()
        if self.fault is EngineFault.OK:
            return inner.result()
        if self.fault is EngineFault.DEAD:
            raise EngineDied(f"engine {self.name}: {what}: the engine died (injected)")
        await asyncio.get_running_loop().create_future()  # wedged: silent until the caller gives up


class FaultyReward:
    """A reward function whose next calls raise (``raise_next``) or hang until ``release()`` (``hang_next``);
    every other call returns ``reward(text, sample)``.

    A hung call blocks a reward-pool thread, as a runaway reward would; ``release()`` ends them so no thread
    outlives the test. Run it in a thread pool (it holds a lock, so it does not pickle).
    """

    def __init__(self, reward: Callable[[str, TaskSample], Any]) -> None:
        self.reward = reward
        self.num_calls = 0
        self._to_raise = 0
        self._to_hang = 0
        self._lock = threading.Lock()
        self._released = threading.Event()

    def raise_next(self, count: int) -> None:
        with self._lock:
            self._to_raise += count

    def hang_next(self, count: int) -> None:
        with self._lock:
            self._to_hang += count

    def __call__(self, response_text: str, sample: TaskSample) -> Any:
        with self._lock:
            number, self.num_calls = self.num_calls, self.num_calls + 1
            fault = "raise" if self._to_raise else "hang" if self._to_hang else None
            self._to_raise -= fault == "raise"
            self._to_hang -= fault == "hang"
        if fault == "raise":
            raise RuntimeError(f"reward call {number} (sample {sample.uid}) failed (injected)")
        if fault == "hang":
            self._released.wait()
        return self.reward(response_text, sample)

    def release(self) -> None:
        """End every hung call (they return normally, long after their timeout)."""
        self._released.set()


class FaultyEngineFactory:
    """Wraps a runtime's engine factory so every engine, first and replacement, is a ``FaultyEngine`` (faults
    can strike a replacement again). ``live[index]`` is engine ``index`` as the proxy has it now, and
    ``replaced[index]`` is set each time that engine is replaced (clear it to wait for the next time)."""

    def __init__(self, factory: Any, engines: list[Any]) -> None:
        """Wraps ``engines`` (the run's list) in place."""
        self.factory = factory
        engines[:] = [FaultyEngine(engine, f"engine-{i}") for i, engine in enumerate(engines)]
        self.live: dict[int, FaultyEngine] = dict(enumerate(engines))
        self.replaced: dict[int, asyncio.Event] = {i: asyncio.Event() for i in self.live}

    async def replace(self, index: int, failed: Any) -> FaultyEngine:
        engine = FaultyEngine(await self.factory.replace(index, failed), f"engine-{index}")
        self.live[index] = engine
        self.replaced[index].set()
        return engine
