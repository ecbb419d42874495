"""Engine recovery: a dead or wedged engine is killed and replaced, and the fresh one holds the current weights
before any request reaches it.

Key decision: the proxy never starts engines itself; the runtime hands it an ``EngineFactory`` (Ray: a new
actor through ``spawn_engine``; inline: a new engine on the base model), so the proxy layer imports no runtime
and one code path serves every runtime.

```
 a call on the engine fails or times out, or a control call fails ──► suspect: recovering (no new requests)
 patrol, every health_check_interval_s: no probe answer within health_check_timeout_s ──┘
   (an engine applying a weight update is not probed: the update's own byte-sized deadline watches it, and
    an engine that dies or wedges mid-update fails that call, which makes it a suspect like any other)
 suspect ─► probe ─ answers, under max_consecutive_failures ─► back in service (a one-off failure)
                  └ silent, raised, or failing repeatedly ─► reclaim its calls (the proxy re-routes them)
                                                           ─► factory.replace(index, old): old killed, new ready
                                                           ─► update_weights(latest published) ─► in service
```

The latest update goes through the runtime's ``readable`` hook (default: as it is): under ``runtime.switch``
the trainer lets go of its copy once every engine applied it, so the hook lends one packed again, of the same
version, for the ``update_weights`` call (``runtime.republish``); the proxy checks the version it was lent.
Once the trainer's weights have moved past that version (its next step began), the hook raises ``Superseded``:
the replacement then stays in recovery until the proxy publishes a newer update (within the ``within_s`` the
hook names, else ``CatchUpTimeout``) and catches up to that one instead.

Invariants (tests/unit/proxy/test_proxy_recovery.py):
1. A replacement serves no request before it holds the latest published weights: its worker stays
   ``recovering`` (not ready, so routing holds or diverts every call) until the last update has landed.
2. A reclaimed call ends its caller's wait at once, even if the engine never answers again (``reclaim``).
3. At most ``max_engine_restarts`` replacements per engine; past that, or if a replacement fails, the engine
   stays unhealthy exactly as without recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from asyncrl.proxy.engine_set import EngineSet
from asyncrl.proxy.errors import EngineFailure
from asyncrl.proxy.worker import EngineClient, EngineWorker, PendingUpdate

logger = logging.getLogger(__name__)

PROBE_REQUEST_ID = "asyncrl-health-probe"
"""The health probe is an abort of this id, which no engine holds: every engine has ``abort`` and runs it on
its own loop (engine thread, actor), so an answer proves that loop alive and costs nothing else."""


class EngineFactory(Protocol):
    """How a runtime replaces engine ``index`` (``runtime.ray_runtime.RayEngineFactory``,
    ``runtime.inline.InlineEngineFactory``)."""

    async def replace(self, index: int, failed: EngineClient) -> EngineClient:
        """End ``failed`` for good (it may be dead or wedged) and return a fresh engine that is ready to serve,
        on the base model (the weights of the proxy's initial version); raise if none could be started."""
        ...


Readable = Callable[[Any, int], AbstractAsyncContextManager[Any]]
"""The runtime's hook around a catch-up: given the latest update's payload and the replaced engine's index, a
context that yields what the replacement applies (of the same version) and lets go of it on exit; it raises
``Superseded`` on entry when that version can no longer be read but a newer one is on its way."""

WaitUntil = Callable[[Callable[[], bool]], Awaitable[None]]
"""The proxy's wait for a change of its state (``proxy.wakeup.Wakeup.wait_until``): returns once the predicate
holds, re-checked whenever the proxy publishes an update or closes."""


class Superseded(Exception):
    """The update a catch-up asked the ``Readable`` hook for can no longer be read, and a newer one will be
    published within ``within_s`` seconds (``runtime.switch``: the trainer let go of its copy and is training
    its next step): the replacement waits for that one."""

    def __init__(self, message: str, within_s: float) -> None:
        super().__init__(message)
        self.within_s = within_s


class CatchUpTimeout(TimeoutError):
    """A replacement told to wait for a newer update (``Superseded``) saw none published within ``within_s``."""


@contextlib.asynccontextmanager
async def as_published(payload: Any, index: int) -> AsyncIterator[Any]:
    """The default ``Readable``: the stored update as it is."""
    yield payload


class EngineRecovery:
    """Watches the workers of ``engines`` and replaces the ones that die or wedge (contract: module docstring).

    ``latest_update()`` is the last update the proxy published (None before the first); ``on_recovered(worker)``
    runs when a worker leaves recovery, in service or not, so the proxy can re-check its waits; ``readable``
    gives what a replacement applies in place of the latest update, and ``wait_until`` waits for the proxy's
    next one when it raises ``Superseded`` (module docstring).
    """

    def __init__(
        self,
        engines: EngineSet,
        factory: EngineFactory,
        *,
        initial_version: int,
        latest_update: Callable[[], PendingUpdate | None],
        on_recovered: Callable[[EngineWorker], None],
        wait_until: WaitUntil,
        readable: Readable = as_published,
    ) -> None:
        self.config = engines.config
        self._engines = engines
        self._factory = factory
        self._initial_version = initial_version
        self._latest_update = latest_update
        self._on_recovered = on_recovered
        self._readable = readable
        self._wait_until = wait_until
        self.counts = {"num_engine_restarts": 0, "num_failed_restarts": 0, "num_failed_probes": 0}
        engines.on_failure = self.suspect
        if self.config.health_check_interval_s is not None:
            engines.spawn(self._patrol(self.config.health_check_interval_s))

    def suspect(self, worker: EngineWorker, *, probed: bool = False) -> None:
        """Take ``worker`` out of service and recover it in the background (``probed``: its probe already
        failed); no-op while it is recovering or once its restarts are spent."""
        if worker.recovering or self._engines.closed:
            return
        if worker.num_restarts >= self.config.max_engine_restarts:
            logger.error("engine %d failed and has used its %d restarts", worker.index, worker.num_restarts)
            return
        worker.recovering = True
        # Healthy while recovering: calls wait for it (it is not ready) rather than fail for want of an engine.
        worker.healthy = True
        self._engines.spawn(self._recover(worker, probed))

    async def _patrol(self, interval_s: float) -> None:
        """Probe every engine in service each ``interval_s``: the only way to see an engine that is alive but
        silent while nothing of its own ran out (a hung generate with no request timeout). An engine applying
        a weight update is skipped, and a probe that overlapped an update is not held against its engine: an
        engine loading weights may answer nothing else (a worker serving one command at a time, an actor
        whose loop is busy), and the update's own deadline watches it."""
        while True:
            await asyncio.sleep(interval_s)
            workers = [
                worker
                for worker in self._engines.workers
                if worker.healthy and not worker.recovering and not worker.updates_in_flight
            ]
            started = [worker.num_updates_started for worker in workers]
            errors = await asyncio.gather(*(self._probe(worker) for worker in workers))
            for worker, before, error in zip(workers, started, errors, strict=True):
                if error is None:
                    continue
                if worker.num_updates_started != before:
                    logger.info(
                        "engine %d missed a health probe during a weight update: %r", worker.index, error
                    )
                    continue
                self._failed_probe(worker, error)
                self.suspect(worker, probed=True)

    async def _probe(self, worker: EngineWorker) -> Exception | None:
        """Why the engine did not answer an abort of ``PROBE_REQUEST_ID`` within ``health_check_timeout_s``;
        None if it did. Not counted here: the caller decides whether the failure is held against the engine."""
        try:
            await asyncio.wait_for(worker.client.abort(PROBE_REQUEST_ID), self.config.health_check_timeout_s)
        except Exception as error:  # deliberate: any failure to answer is what the probe looks for
            return error
        return None

    def _failed_probe(self, worker: EngineWorker, error: Exception) -> None:
        """Count a probe failure held against ``worker`` (``recovery/failed_probes``: forgiven ones are not)."""
        self.counts["num_failed_probes"] += 1
        logger.warning("engine %d failed its health probe: %r", worker.index, error)

    async def _answers(self, worker: EngineWorker) -> bool:
        """Whether a suspect engine answers its probe; a failure counts (it gets the engine replaced)."""
        error = await self._probe(worker)
        if error is not None:
            self._failed_probe(worker, error)
        return error is None

    async def _recover(self, worker: EngineWorker, probed: bool) -> None:
        try:
            if (
                not probed
                and self._may_keep(worker)
                and await self._answers(worker)
                and self._may_keep(worker)
            ):
                return  # a one-off failure: the engine answers, its version is known
            await self._replace(worker)
        finally:
            worker.recovering = False
            self._on_recovered(worker)

    def _may_keep(self, worker: EngineWorker) -> bool:
        """Whether a failed engine may stay if it answers its probe: its version is known (no control call
        failed) and its calls have not failed ``max_consecutive_failures`` times in a row."""
        return (
            worker.control_error is None
            and worker.consecutive_failures < self.config.max_consecutive_failures
        )

    async def _replace(self, worker: EngineWorker) -> None:
        """Reclaim the engine's calls, start its replacement and bring it to the latest published weights."""
        num_reclaimed = self._engines.reclaim(worker)
        logger.warning("replacing engine %d (%d requests re-routed)", worker.index, num_reclaimed)
        worker.num_restarts += 1
        try:
            worker.client = await self._factory.replace(worker.index, worker.client)
            worker.applying = None  # an update still running on the old engine no longer concerns this one
            await self._catch_up(worker)
        except Exception as error:  # deliberate: a failed restart leaves the engine out, as with no recovery
            self.counts["num_failed_restarts"] += 1
            failure = EngineFailure(worker.index, "restart")
            failure.__cause__ = error
            logger.error("engine %d could not be replaced: %r", worker.index, error)
            worker.control_error = failure
            worker.healthy = False
            return
        worker.control_error = None
        worker.consecutive_failures = 0
        worker.healthy = True
        self.counts["num_engine_restarts"] += 1
        logger.warning("engine %d replaced, serving v%d", worker.index, worker.version)

    async def _catch_up(self, worker: EngineWorker) -> None:
        """Send the fresh engine the latest published update, again if a newer one is published meanwhile, or
        once one is when the runtime can no longer lend the latest (``Superseded``)."""
        update = self._latest_update()
        if update is None and self._initial_version != 0:
            raise RuntimeError(
                f"engine {worker.index}: a fresh engine serves the base model, but the proxy started at "
                f"v{self._initial_version} and has published no update to send it"
            )
        worker.version = self._initial_version
        while update is not None and update.version > worker.version:
            try:
                async with self._readable(update.named_tensors, worker.index) as payload:
                    lent = getattr(payload, "version", update.version)
                    if lent != update.version:
                        raise RuntimeError(
                            f"engine {worker.index}: catching up to v{update.version}, the runtime lent v{lent}"
                        )
                    await self._engines.control(worker, "update_weights", payload, update.version)
            except Superseded as gone:
                logger.warning(
                    "engine %d waits for the update after v%d: %s", worker.index, update.version, gone
                )
                update = await self._newer_than(update.version, gone.within_s)
                continue
            worker.version = update.version
            update = self._latest_update()
        if worker.pending is not None and worker.pending.version <= worker.version:
            worker.pending = None

    async def _newer_than(self, version: int, within_s: float) -> PendingUpdate:
        """The proxy's latest update once it is newer than ``version``, within ``within_s``."""

        def newer() -> bool:
            latest = self._latest_update()
            return self._engines.closed or (latest is not None and latest.version > version)

        try:
            await asyncio.wait_for(self._wait_until(newer), within_s)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
            raise CatchUpTimeout(
                f"a replaced engine waited {within_s} s for an update newer than v{version}, which the runtime "
                "could no longer lend; none was published"
            ) from None
        latest = self._latest_update()
        if latest is None or latest.version <= version:
            raise RuntimeError(
                f"the proxy closed while a replaced engine waited for an update after v{version}"
            )
        return latest
