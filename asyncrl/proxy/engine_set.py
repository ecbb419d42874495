"""The engine workers of one proxy and what every proxy does with them, whatever its weight-update policy.

Key decision: one place owns the per-engine bookkeeping that both ``LLMProxy`` and ``MultiVersionProxy``
need — the workers, one engine call counted in flight and bounded by ``request_timeout_s``, control calls
bounded by ``control_timeout_s``, health, the proxy's background tasks and the per-engine inspection — so the
two proxies differ only in routing and in how engines reach new weights.

```
 proxy ── attempt(worker, request, run) ──► counted in flight ──► run() on the engine ──► Generation
                                            │ request_timeout_s: abort there, RequestTimeout
                                            │ raise: EngineFailure; health: record_failure / success
       ── control(worker, op, ...) ───────► op within control_timeout_s, any error → EngineFailure
       ── mark_unhealthy(worker, error) ──► no new requests; its version is unknown from now on
```

Health: a worker is unhealthy after ``max_consecutive_failures`` failed or timed-out calls in a row, or at
once when a control call fails (then ``control_error`` says why). Unhealthy engines get no new requests; what
happens to the requests they still hold is the proxy's policy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.errors import EngineFailure, RequestTimeout
from asyncrl.proxy.worker import EngineClient, EngineWorker
from asyncrl.types import FinishReason, Generation, Request

logger = logging.getLogger(__name__)


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
        self._background: set[asyncio.Task[Any]] = set()
        self._attempt_ids = itertools.count()

    # ---- engine calls --------------------------------------------------------------------------------

    async def attempt(
        self, worker: EngineWorker, request: Request, run: Callable[[], Awaitable[Generation]]
    ) -> Generation:
        """``run()`` (one engine call serving ``request`` on ``worker``), counted in flight while it runs.

        Raises ``RequestTimeout`` past ``request_timeout_s`` (the request aborted on the engine) and
        ``EngineFailure`` if the engine raised; both count against the worker's health.
        """
        attempt_id = next(self._attempt_ids)
        worker.start(attempt_id, request, self.clock())
        try:
            generation = await self._bounded(worker, request.request_id, run)
        except RequestTimeout:
            worker.record_failure(self.config.max_consecutive_failures)
            raise
        except Exception as error:
            worker.record_failure(self.config.max_consecutive_failures)
            logger.warning("engine %d failed request %s: %r", worker.index, request.request_id, error)
            raise EngineFailure(worker.index, "generate", request.request_id) from error
        finally:
            worker.finish(attempt_id, self.clock())
        if generation.finish_reason is not FinishReason.ABORT:
            worker.record_success()
        worker.total_tokens += len(generation.token_ids) - len(request.prefix_token_ids)
        return generation

    async def _bounded(
        self, worker: EngineWorker, request_id: str, run: Callable[[], Awaitable[Generation]]
    ) -> Generation:
        timeout = self.config.request_timeout_s
        if timeout is None:
            return await run()
        task = asyncio.ensure_future(run())
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done:
            return task.result()
        logger.warning("request %s timed out after %s s on engine %d", request_id, timeout, worker.index)
        await self._abort_and_reap(worker, request_id, task)
        raise RequestTimeout(request_id, worker.index, timeout)

    async def _abort_and_reap(self, worker: EngineWorker, request_id: str, task: asyncio.Task[Any]) -> None:
        """Abort a timed-out request on its engine and let its call return (cancelled after a control timeout)."""
        try:
            await self.control(worker, "abort", request_id, request_id=request_id)
        except EngineFailure as failure:
            logger.warning("%s: %r", failure, failure.__cause__)
        done, _ = await asyncio.wait({task}, timeout=self.config.control_timeout_s)
        if not done:
            task.cancel()
        elif not task.cancelled():
            task.exception()  # retrieved: the caller gets RequestTimeout instead

    async def control(
        self, worker: EngineWorker, operation: str, *args: Any, request_id: str | None = None
    ) -> Any:
        """Call ``operation`` on an engine within ``control_timeout_s``; any error becomes ``EngineFailure``."""
        try:
            method = getattr(worker.client, operation)
            return await asyncio.wait_for(method(*args), self.config.control_timeout_s)
        except Exception as error:
            raise EngineFailure(worker.index, operation, request_id) from error

    # ---- health and background work ------------------------------------------------------------------

    def mark_unhealthy(self, worker: EngineWorker, failure: BaseException) -> None:
        """A control call failed: the engine gets nothing more and its weight version is unknown."""
        logger.error("engine %d is unhealthy from now on: %s (%r)", worker.index, failure, failure.__cause__)
        worker.healthy = False
        worker.control_error = failure
        worker.pending = None

    def control_failure(self) -> BaseException | None:
        """The first control failure of any engine, if one failed."""
        return next((w.control_error for w in self.workers if w.control_error is not None), None)

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coroutine`` in the background, kept referenced until it ends and cancelled by ``close``."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def close(self) -> None:
        """Cancel every background task."""
        for task in list(self._background):
            task.cancel()

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
