"""The engine workers of one proxy and what every proxy does with them, whatever its weight-update policy.

Key decision: one place owns the per-engine bookkeeping that both ``LLMProxy`` and ``MultiVersionProxy``
need — the workers, one engine call counted in flight and bounded by ``request_timeout_s``, control calls
bounded by ``control_timeout_s``, health, the proxy's background tasks (``close`` / ``aclose``) and the
per-engine inspection — so the two proxies differ only in routing and in how engines reach new weights.
An engine call costs one task, one future and one timer, however many are in flight (see ``_call_ended``).

```
 proxy ── start(worker, request, run) ──► task: run() on the engine, counted in flight until it ends
       ── await_call(worker, task, id) ──► Generation   │ request_timeout_s: abort there, reap, RequestTimeout
          (attempt = start + await_call)               │ raise: EngineFailure; health: record_failure/success
                                                       │ close(): ProxyClosed; caller cancelled: abort sent
       ── control(worker, op, ...) ───────► op within control_timeout_s, any error → EngineFailure
                                            (update_weights: within its bytes' deadline, updates_in_flight)
       ── mark_unhealthy(worker, error) ──► no new requests; its version is unknown from now on
```

Health: a worker is unhealthy after ``max_consecutive_failures`` failed or timed-out calls in a row, or at
once when a control call fails (then ``control_error`` says why). Unhealthy engines get no new requests; what
happens to the requests they still hold is the proxy's policy. ``on_failure(worker)`` hears of every failed
call (``proxy.recovery`` probes the engine then), and ``reclaim(worker)`` takes every call still on an engine
back from it at once (its callers get ``EngineReclaimed``): the engine is about to be killed and replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.errors import EngineFailure, EngineReclaimed, ProxyClosed, RequestTimeout
from asyncrl.proxy.worker import EngineClient, EngineWorker
from asyncrl.types import FinishReason, Generation, InvalidRequest, Request
from asyncrl.weight_sync.protocol import payload_nbytes

logger = logging.getLogger(__name__)

_DEADLINE_SLACK_S = 1e-6
"""A request timeout this close to its deadline has expired (float rounding of loop time less held time)."""


class EngineSet:
    """Workers ``0..n-1`` over ``engines``, all starting at ``initial_version`` (see the module docstring)."""

    def __init__(
        self,
        engines: Sequence[EngineClient],
        config: ProxyConfig,
        *,
        initial_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
        owner: str = "a proxy",
        on_call_end: Callable[[EngineWorker, Request], None] | None = None,
    ) -> None:
        if not engines:
            raise ValueError(f"{owner} needs at least one engine")
        self.config = config
        self.clock = clock
        now = clock()
        self.workers = [
            EngineWorker(index=i, client=engine, version=initial_version, started_at=now)
            for i, engine in enumerate(engines)
        ]
        self.closed = False
        self._on_call_end = on_call_end
        self._background: set[asyncio.Task[Any]] = set()
        """Engine calls and the proxy's own tasks; ``close`` cancels them."""
        self._call_waiters: dict[asyncio.Future[None], asyncio.Task[Generation]] = {}
        """One per caller awaiting an engine call, with that call; ``close`` and ``reclaim`` resolve them."""
        self._attempt_ids = itertools.count()
        self._calls_on: dict[int, dict[int, tuple[asyncio.Task[Generation], Request]]] = {}
        """Engine index → attempt id → (engine call, request), for ``reclaim``."""
        self._reclaimed: set[asyncio.Task[Generation]] = set()
        """Engine calls taken back by ``reclaim`` whose callers have not been told yet."""
        self.on_failure: Callable[[EngineWorker], None] | None = None
        """Called when a call on an engine fails or times out, or a control call fails (``proxy.recovery``)."""
        self.num_reclaimed = 0
        self._held_since: float | None = None
        """Loop time timeouts were last held at, while they are (``hold_timeouts``); None otherwise."""
        self._held_total = 0.0
        """Loop seconds timeouts were held before ``_held_since``: subtracted from every call's timeout clock."""
        self._parked: dict[Callable[[], None], None] = {}
        """The timeout checks of calls whose timer fired while timeouts were held: run again at the resume, in
        the order they parked (a dict, not a set: a seeded schedule replays the same order in any process)."""

    def hold_timeouts(self, held: bool) -> None:
        """Stop (``held``) or restart the clock ``request_timeout_s`` reads: the engines sleep (``runtime.switch``,
        ``LLMProxy.suspend(engines_asleep=True)``), so time a call spends on one then is not the engine's fault
        and must not expire into a failure (and, three in a row, a reload of a healthy engine). Restarted, each call
        whose timer fired meanwhile is timed again at once for what it has left, so it expires when its awake time
        reaches ``request_timeout_s``, not up to a timeout later."""
        now = asyncio.get_running_loop().time()
        if held and self._held_since is None:
            self._held_since = now
        elif not held and self._held_since is not None:
            self._held_total += now - self._held_since
            self._held_since = None
            parked, self._parked = self._parked, {}
            for expire in parked:
                expire()

    def _held_time(self, now: float) -> float:
        """Loop seconds timeouts were held so far (``hold_timeouts``), up to ``now``."""
        return self._held_total + (0.0 if self._held_since is None else now - self._held_since)

    def record_busy_spans(self, sink: Callable[[int, float, float], None]) -> None:
        """Call ``sink(index, start, end)`` for every busy stretch of every engine from now on."""
        for worker in self.workers:
            worker.on_busy_span = sink

    # ---- engine calls --------------------------------------------------------------------------------

    async def attempt(
        self, worker: EngineWorker, request: Request, run: Callable[[], Awaitable[Generation]]
    ) -> Generation:
        """``run()`` (one engine call serving ``request`` on ``worker``): ``start`` then ``await_call``."""
        return await self.await_call(worker, self.start(worker, request, run), request.request_id)

    def start(
        self, worker: EngineWorker, request: Request, run: Callable[[], Awaitable[Generation]]
    ) -> asyncio.Task[Generation]:
        """Start ``run()`` as a task, counted in flight on ``worker`` from now until the call itself ends.

        Synchronous, so a caller that routed to a ready engine counts the call there before anything else
        runs. The count outlives a caller that gave up (timeout, cancel): under the drain policy an engine
        must not be updated while it may still be generating. ``on_call_end`` runs when the count drops.
        """
        attempt_id = next(self._attempt_ids)
        worker.start(attempt_id, request, self.clock())
        task = asyncio.ensure_future(self._engine_call(worker, request, attempt_id, run))
        self._background.add(task)  # one done callback (below) instead of spawn's second one
        self._calls_on.setdefault(worker.index, {})[attempt_id] = (task, request)
        task.add_done_callback(lambda done: self._on_call_done(worker, request, attempt_id, done))
        return task

    async def await_call(
        self, worker: EngineWorker, task: asyncio.Task[Generation], request_id: str
    ) -> Generation:
        """The result of engine call ``task`` (from ``start``) of ``request_id`` on ``worker``.

        Raises ``EngineFailure`` if the engine raised, ``EngineReclaimed`` if ``reclaim`` took the call back,
        ``RequestTimeout`` past ``request_timeout_s`` (the request aborted on the engine and reaped; counts
        against health) and ``ProxyClosed`` on ``close``. A cancelled caller leaves the abort and reap to a
        background task.
        """
        try:
            await self._call_ended(task)
        except asyncio.CancelledError:
            self.spawn(self._abort_and_reap(worker, request_id, task))
            raise
        if task in self._reclaimed:
            self._reclaimed.discard(task)
            raise EngineReclaimed(worker.index, "generate", request_id)
        if task.done() and not task.cancelled():
            return task.result()
        if self.closed or task.cancelled():
            task.cancel()
            raise ProxyClosed(
                f"request {request_id!r}: the proxy was closed while engine {worker.index} served it"
            )
        return await self._time_out(worker, task, request_id)

    async def _engine_call(
        self,
        worker: EngineWorker,
        request: Request,
        attempt_id: int,
        run: Callable[[], Awaitable[Generation]],
    ) -> Generation:
        try:
            generation = await run()
        except InvalidRequest:
            raise  # the request's fault, not the engine's: no health cost, no retry elsewhere
        except Exception as error:
            worker.record_failure(self.config.max_consecutive_failures)
            logger.warning("engine %d failed request %s: %r", worker.index, request.request_id, error)
            self._failed(worker)
            raise EngineFailure(worker.index, "generate", request.request_id) from error
        finally:
            self._finish(worker, request, attempt_id)
        if generation.finish_reason is not FinishReason.ABORT:
            worker.record_success()
        worker.total_tokens += len(generation.token_ids) - len(request.prefix_token_ids)
        return generation

    async def _call_ended(self, task: asyncio.Task[Generation]) -> None:
        """Return when ``task`` is done, the set closes or ``request_timeout_s`` passes.

        ``asyncio.wait({task, closed})`` with a shared "closed" future or event would cost a task or an
        O(in-flight) callback removal per call; thousands are in flight in a large simulated cluster, and the
        simulator pushes some hundred thousand calls through here.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        task.add_done_callback(wake)
        self._call_waiters[waiter] = task
        timeout = self.config.request_timeout_s
        # when the call expires, in loop time less the time timeouts were held (``hold_timeouts``)
        deadline = None if timeout is None else loop.time() - self._held_time(loop.time()) + timeout
        timer: asyncio.TimerHandle | None = None

        def expire() -> None:
            """Wake at ``deadline``; before it (time passed held) wait for the rest, or, while still held, park
            until ``hold_timeouts`` restarts the clock and runs this again. Rounding (``_DEADLINE_SLACK_S``) must
            not re-arm the timer at the instant it fired: a virtual clock would spin there."""
            nonlocal timer
            assert timeout is not None and deadline is not None
            now = loop.time()
            if self._held_since is not None:
                timer = None
                self._parked[expire] = None
                return
            left = deadline - (now - self._held_time(now))
            if left <= _DEADLINE_SLACK_S:
                wake()
            else:
                timer = loop.call_later(left, expire)

        if timeout is not None:
            timer = loop.call_later(timeout, expire)
        if self.closed:
            wake()
        try:
            await waiter
        finally:
            self._call_waiters.pop(waiter, None)
            task.remove_done_callback(wake)
            self._parked.pop(expire, None)
            if timer is not None:
                timer.cancel()

    async def _time_out(
        self, worker: EngineWorker, task: asyncio.Task[Generation], request_id: str
    ) -> Generation:
        timeout = self.config.request_timeout_s
        assert timeout is not None
        logger.warning("request %s timed out after %s s on engine %d", request_id, timeout, worker.index)
        await self._abort_and_reap(worker, request_id, task)
        worker.record_failure(self.config.max_consecutive_failures)
        self._failed(worker)
        raise RequestTimeout(request_id, worker.index, timeout)

    async def _abort_and_reap(
        self, worker: EngineWorker, request_id: str, task: asyncio.Task[Generation]
    ) -> None:
        """Abort an abandoned engine call and give it ``control_timeout_s`` to return; cancel it after.

        Until it has returned (or its cancellation has landed) the call stays counted in flight.
        """
        try:
            await self.control(worker, "abort", request_id, request_id=request_id)
        except EngineFailure as failure:
            logger.warning("%s: %r", failure, failure.__cause__)
        done, _ = await asyncio.wait({task}, timeout=self.config.control_timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=self.config.control_timeout_s)

    def _finish(self, worker: EngineWorker, request: Request, attempt_id: int) -> None:
        self._calls_on.get(worker.index, {}).pop(attempt_id, None)
        if worker.finish(attempt_id, self.clock()) and self._on_call_end is not None:
            self._on_call_end(worker, request)

    def _failed(self, worker: EngineWorker) -> None:
        if self.on_failure is not None:
            self.on_failure(worker)

    def reclaim(self, worker: EngineWorker) -> int:
        """Take every call still on ``worker``'s engine back now; returns how many.

        Each stops counting in flight at once (so a drain never waits on an engine about to be killed), its
        task is cancelled, and its caller gets ``EngineReclaimed`` without waiting for the task to end: a
        wedged engine may never let it.
        """
        calls = self._calls_on.pop(worker.index, {})
        tasks = {task for task, _ in calls.values()}
        for attempt_id, (task, request) in calls.items():
            self._reclaimed.add(task)
            logger.warning("request %s taken back from engine %d", request.request_id, worker.index)
            self._finish(worker, request, attempt_id)
            task.cancel()
        for waiter, task in self._call_waiters.items():
            if task in tasks and not waiter.done():
                waiter.set_result(None)
        self.num_reclaimed += len(calls)
        return len(calls)

    def _on_call_done(
        self, worker: EngineWorker, request: Request, attempt_id: int, task: asyncio.Task[Generation]
    ) -> None:
        """Forget the engine call, finish it if it was cancelled before it ran, and retrieve an exception
        nobody awaited."""
        self._background.discard(task)
        self._finish(worker, request, attempt_id)
        if not task.cancelled():
            task.exception()
        elif task in self._reclaimed and not any(task is t for t in self._call_waiters.values()):
            self._reclaimed.discard(task)  # its caller had already left (cancelled or timed out)

    async def control(
        self, worker: EngineWorker, operation: str, *args: Any, request_id: str | None = None
    ) -> Any:
        """Call ``operation`` on an engine within ``control_timeout_s`` (a weight update: within its bytes'
        deadline, ``ProxyConfig.update_timeout_s``, and exempt from the health patrol while it runs); any error
        becomes ``EngineFailure``."""
        updating = operation == "update_weights"
        timeout_s = self.config.control_timeout_s
        if updating:
            timeout_s = self.config.update_timeout_s(payload_nbytes(args[0]))
            worker.updates_in_flight += 1
            worker.num_updates_started += 1
        try:
            method = getattr(worker.client, operation)
            return await asyncio.wait_for(method(*args), timeout_s)
        except Exception as error:
            raise EngineFailure(worker.index, operation, request_id) from error
        finally:
            if updating:
                worker.updates_in_flight -= 1

    # ---- health and background work ------------------------------------------------------------------

    def mark_unhealthy(self, worker: EngineWorker, failure: BaseException) -> None:
        """A control call failed: the engine gets nothing more and its weight version is unknown."""
        logger.error(
            "engine %d is unhealthy, its version unknown: %s (%r)", worker.index, failure, failure.__cause__
        )
        worker.healthy = False
        worker.control_error = failure
        worker.pending = None
        self._failed(worker)

    def control_failure(self, older_than: int | None = None) -> BaseException | None:
        """The first control failure of any engine (of one still below version ``older_than`` if given) that
        no recovery is repairing."""
        return next(
            (
                worker.control_error
                for worker in self.workers
                if worker.control_error is not None
                and not worker.recovering
                and (older_than is None or worker.version < older_than)
            ),
            None,
        )

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coroutine`` in the background, kept referenced until it ends and cancelled by ``close``
        (at once when spawned after it)."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if self.closed:
            task.cancel()
        return task

    def close(self) -> None:
        """End every wait for an engine call (``ProxyClosed``) and cancel every background task; idempotent."""
        self.closed = True
        for waiter in self._call_waiters:
            if not waiter.done():
                waiter.set_result(None)
        for task in list(self._background):
            task.cancel()

    async def aclose(self) -> None:
        """``close``, then wait until the cancelled tasks have ended (each gets ``control_timeout_s``), so no
        task is left to be destroyed pending or to log its end after the event loop (or Ray) shut down."""
        self.close()
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.config.control_timeout_s)

    # ---- inspection ----------------------------------------------------------------------------------

    def versions(self) -> list[int]:
        """The version each engine serves now (one still switching or draining reports its old version)."""
        return [worker.version for worker in self.workers]

    def healthy_engines(self) -> list[int]:
        """Indices of the engines that still receive requests."""
        return [worker.index for worker in self.workers if worker.healthy]

    def engine_stats(self) -> list[dict[str, Any]]:
        """Per engine: load, version, health, busy time, idle fraction and tokens, at the clock's now."""
        now = self.clock()
        return [worker.stats(now) for worker in self.workers]
