"""The asyncio face of the engine: ``await generate(request)`` with the step loop on its own thread.

    caller coroutines ──commands──▶ [queue + condition] ──▶ engine thread: run commands, then core.step()
            ▲                                                        │
            └──────── futures resolved via loop.call_soon_threadsafe ◀┘

Only the engine thread touches the ``LLMEngine`` core, and commands (add, abort, pause, update, resume) run
between steps, so ``await pause()`` returns with no step in flight. The thread sleeps on the condition when
it has no commands and nothing to step (no busy spin). Invariants: every ``generate`` future is resolved
exactly once (a generation, a ValueError for its own bad input, or the loop's failure); a failure in the step
loop or a shutdown reaches every waiting caller, and later calls fail at once. A request served by
``generate_observed`` also has its output so far reported after each step that added to it, on the caller's
loop and before its future resolves (the endpoint streams tokens from it).

On CUDA the thread issues its kernels on a stream of its own (``engine.cuda_stream``), and every command that
takes device memory in or gives it out (weights, sleep/wake, request migration) runs as one ordered hand-off
(``engine.streams``, which lists them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.engine.migration import RequestState
from asyncrl.engine.streams import EngineStream
from asyncrl.engine.weights import NamedTensors
from asyncrl.torch_threads import claim_torch_threads
from asyncrl.types import Generation, Request, TokenObserver

logger = logging.getLogger(__name__)


class EngineStoppedError(RuntimeError):
    """The engine was shut down or its step loop failed; carries the cause as ``__cause__``."""


class AsyncEngine:
    """Serve an ``LLMEngine`` to asyncio callers from a background thread."""

    def __init__(
        self, core: LLMEngine, num_threads: int | None = None, stream: EngineStream | None = None
    ) -> None:
        """``num_threads``: torch threads of the engine thread (default: the constructing thread's count).
        Claimed in the engine thread before each step (``asyncrl.torch_threads``): OpenMP thread counts are per
        thread, and a process whose *other* threads also own multi-thread OpenMP teams has every team's
        spin-wait throttled by libgomp (measured: the same decode loop 8.1 k tok/s on the only team, 4.6 k
        beside the main thread's; docs/benchmarks.md).

        ``stream``: the engine thread's CUDA stream (default: ``EngineStream.for_device`` of the core's device
        and ``engine.cuda_stream``; a no-op off CUDA)."""
        self.core = core
        self.stream = stream or EngineStream.for_device(core.runner.device, core.config.cuda_stream)
        self._num_threads = num_threads or torch.get_num_threads()
        self._cond = threading.Condition()
        self._commands: deque[_Command] = deque()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._observers: dict[str, _Observer] = {}
        self._stopped: BaseException | None = None
        self._started_at = time.perf_counter()
        self._idle_seconds = 0.0
        self._idle_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="asyncrl-engine", daemon=True)
        self._thread.start()

    async def generate(self, request: Request) -> Generation:
        """The finished generation; an abort returns the partial one. Cancelling the call aborts the request."""
        return await self._serve(request.request_id, lambda: self.core.add_request(request))

    async def generate_observed(self, request: Request, observe: TokenObserver) -> Generation:
        """``generate``, with ``observe`` called on the caller's loop with the output so far after each engine
        step that sampled a token for it (one token per step in decode), so a server can stream them."""
        loop = asyncio.get_running_loop()

        def add() -> None:
            self.core.add_request(request)
            self._observers[request.request_id] = _Observer(loop, observe)

        return await self._serve(request.request_id, add)

    async def export_request(self, request_id: str) -> RequestState | None:
        """Take an in-flight request out with its KV (engine/migration.py); its ``generate`` call returns the
        partial output with ``finish_reason="abort"``. None if the request is not here (e.g. already done)."""
        return await self._call(lambda: self._export(request_id))

    async def import_request(self, state: RequestState) -> Generation:
        """Continue an exported request here (same version) and return its finished generation, like ``generate``."""
        return await self._serve(
            state.request_id, lambda: self.stream.handoff(lambda: self.core.import_request(state))
        )

    async def _serve(self, request_id: str, add: Callable[[], Any]) -> Generation:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(_Command(lambda: self._add(request_id, add, loop, future), loop, future, settles=False))
        try:
            return await future
        except asyncio.CancelledError:
            with self._cond:
                if self._stopped is None:
                    self._commands.append(_Command(lambda: self._abort(request_id), loop, None))
                    self._cond.notify()
            raise

    async def abort(self, request_id: str) -> Generation | None:
        return await self._call(lambda: self._abort(request_id))

    async def pause(self) -> None:
        await self._call(self.core.pause)

    async def resume(self) -> None:
        await self._call(self.core.resume)

    async def sleep(self, level: int = 1) -> int:
        """Free the device between steps (``LLMEngine.sleep``); the bytes freed."""
        return await self._handoff(lambda: self.core.sleep(level))

    async def wake(self) -> int:
        """Undo ``sleep`` (``LLMEngine.wake``); the bytes allocated again."""
        return await self._handoff(self.core.wake)

    @property
    def version(self) -> int:
        """The policy version the engine serves."""
        return self.core.version

    async def update_weights(
        self, named_tensors: NamedTensors, version: int, *, partial: bool = False
    ) -> None:
        await self._handoff(lambda: self.core.update_weights(named_tensors, version, partial=partial))

    async def apply_bucket(self, named_tensors: NamedTensors) -> None:
        """One bucket of a streamed broadcast, copied between steps (``LLMEngine.apply_bucket``)."""
        await self._handoff(lambda: self.core.apply_bucket(named_tensors))

    async def finish_stream(self, version: int) -> None:
        await self._call(lambda: self.core.finish_stream(version))

    async def prefetch_weights(self, update: Any) -> None:
        """Read a coming update's files before the pause (delta transport), off the engine's step thread."""
        await asyncio.to_thread(self.core.prefetch_weights, update)

    def stats(self) -> dict[str, Any]:
        """The core's counters plus, since construction, uptime, idle seconds, idle fraction and tokens/s.

        Read without locking (a snapshot may be a step old); difference two snapshots for a window.
        """
        now = time.perf_counter()
        uptime = max(now - self._started_at, 1e-9)
        idle_since = self._idle_since
        idle = self._idle_seconds + (0.0 if idle_since is None else now - idle_since)
        stats = self.core.stats()
        stats["uptime_s"] = uptime
        stats["idle_seconds"] = idle
        stats["idle_fraction"] = min(idle / uptime, 1.0)
        stats["tokens_per_s"] = stats["num_generated_tokens"] / uptime
        return stats

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread after its current step; every waiting caller gets ``EngineStoppedError``."""
        with self._cond:
            if self._stopped is None:
                self._stopped = EngineStoppedError("engine was shut down")
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"engine thread did not stop within {timeout} s")

    async def _call(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(_Command(fn, loop, future))
        return await future

    async def _handoff(self, fn: Callable[[], Any]) -> Any:
        """``_call`` for a command that takes device memory in or gives it out, ordered across streams."""
        return await self._call(lambda: self.stream.handoff(fn))

    def _submit(self, command: _Command) -> None:
        with self._cond:
            if self._stopped is not None:
                raise EngineStoppedError("engine is not running") from self._stopped
            self._commands.append(command)
            self._cond.notify()

    def _add(
        self, request_id: str, add: Callable[[], Any], loop: asyncio.AbstractEventLoop, future: asyncio.Future
    ) -> None:
        add()
        self._pending[request_id] = (loop, future)

    def _export(self, request_id: str) -> RequestState | None:
        state = self.stream.handoff(lambda: self.core.export_request(request_id))
        if state is not None:
            self._deliver([state.partial_generation()])
        return state

    def _abort(self, request_id: str) -> Generation | None:
        generation = self.core.abort(request_id)
        if generation is not None:
            self._deliver([generation])
        return generation

    def _deliver(self, generations: list[Generation]) -> None:
        """Resolve finished requests with one wake-up per caller loop, not one per request: each wake-up is a
        write to the loop's self-pipe and a GIL hand-off, and a profile of an engine actor found ~6 % of its
        samples in the engine thread waking its loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
        for generation in generations:
            self._observers.pop(generation.request_id, None)
            loop, future = self._pending.pop(generation.request_id)
            by_loop.setdefault(loop, []).append((future, generation, None))
        for loop, outcomes in by_loop.items():
            settle_threadsafe(loop, outcomes)

    def _run(self) -> None:
        try:
            with self.stream.serving():
                while self._next_commands():
                    self._deliver(self.core.step())
                    self._report_progress()
        except (
            Exception
        ) as exc:  # deliberate: the failure must reach every waiting caller, not kill them silently
            logger.exception("engine step loop failed; failing all pending requests")
            with self._cond:
                self._stopped = EngineStoppedError(f"engine step loop failed: {exc!r}")
                self._stopped.__cause__ = exc
        finally:
            self._fail_pending()

    def _report_progress(self) -> None:
        """Tell each observer of a still-running request its output, when a step added to it (finished
        requests were reported by their Generation)."""
        for request_id, observer in self._observers.items():
            token_ids = self.core.output_so_far(request_id)
            if (
                token_ids is not None
                and len(token_ids) != observer.num_reported
                and not observer.loop.is_closed()
            ):
                observer.num_reported = len(token_ids)
                observer.loop.call_soon_threadsafe(
                    observer.observe, token_ids
                )  # a fresh list, the observer's

    def _next_commands(self) -> bool:
        """Run queued commands, sleeping while there is nothing to do; False once the engine must stop."""
        while True:
            with self._cond:
                self._idle_since = time.perf_counter()
                while self._stopped is None and not self._commands and not self._can_step():
                    self._cond.wait()
                self._idle_seconds += time.perf_counter() - self._idle_since
                self._idle_since = None
                if self._stopped is not None:
                    return False
                commands, self._commands = self._commands, deque()
            claim_torch_threads(self._num_threads)  # for these commands and the step after them
            while commands:  # popped, not iterated: no finished command (its closure may hold a weight
                commands.popleft().run()  # bucket) stays referenced while this thread waits for the next
            if self._can_step():
                return True

    def _can_step(self) -> bool:
        return not self.core.paused and not self.core.asleep and self.core.has_work()

    def _fail_pending(self) -> None:
        with self._cond:
            error, commands = self._stopped, self._commands
            self._commands = deque()
        for command in commands:
            command.fail(error)
        for loop, future in self._pending.values():
            resolve_threadsafe(loop, future, exception=error)
        self._pending.clear()
        self._observers.clear()


class _Observer:
    """Where an observed request's progress goes, and how much of it was already told."""

    def __init__(self, loop: asyncio.AbstractEventLoop, observe: TokenObserver) -> None:
        self.loop, self.observe, self.num_reported = loop, observe, 0


class _Command:
    """Work for the engine thread and the future (if any) that hears how it went."""

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future | None,
        *,
        settles: bool = True,
    ) -> None:
        self.fn, self.loop, self.future, self.settles = fn, loop, future, settles

    def run(self) -> None:
        """Call ``fn``; its error (e.g. the caller's bad request or state dict) goes back to the caller only.
        ``fn`` is dropped before the caller hears the result, so what its closure holds (a streamed weight
        bucket) is freed by then, not whenever this command is next overwritten."""
        fn, self.fn = self.fn, _ran
        try:
            result = fn()
        except Exception as exc:
            del fn
            self.fail(exc)
        else:
            del fn
            if self.settles and self.future is not None:
                resolve_threadsafe(self.loop, self.future, result=result)

    def fail(self, exception: BaseException | None) -> None:
        if self.future is not None:
            resolve_threadsafe(self.loop, self.future, exception=exception)


Outcome = tuple[asyncio.Future, Any, BaseException | None]
"""A future and what settles it: (future, result, exception), the exception winning when not None."""


def settle_threadsafe(loop: asyncio.AbstractEventLoop, outcomes: list[Outcome]) -> None:
    """Settle ``outcomes``' futures on their loop from any thread, in one wake-up of that loop, skipping those
    the caller already gave up on (cancelled, loop closed). Engines serve asyncio callers from their own
    threads (this one, the vLLM client's reader)."""

    def settle() -> None:
        for future, result, exception in outcomes:
            if future.done():
                continue
            if exception is not None:
                future.set_exception(exception)
            else:
                future.set_result(result)

    if not loop.is_closed():
        loop.call_soon_threadsafe(settle)


def resolve_threadsafe(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future,
    *,
    result: Any = None,
    exception: BaseException | None = None,
) -> None:
    """``settle_threadsafe`` for one future."""
    settle_threadsafe(loop, [(future, result, exception)])


def _ran() -> None:
    """What a command holds once its work ran (``_Command.run``)."""
    raise RuntimeError("an engine command ran twice")
