"""ProxyShell: what every proxy shares, so ``LLMProxy`` and ``MultiVersionProxy`` hold only what differs.

Shared: the engine set and its load index, prompt affinity, the table of calls in flight (one per request
id), the wake-up for held calls, the suspended/closed/latest-version state, and the inspection and shutdown
methods. Each proxy supplies its own call record (``_new_call``), how a call is served (``_serve``), what
happens when a call leaves (``_call_ended``) and how a load change is propagated (``_on_load_change``).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.engine_set import EngineSet
from asyncrl.proxy.errors import EnginesLost, ProxyClosed
from asyncrl.proxy.routing import AffinityTable, LoadIndex
from asyncrl.proxy.wakeup import Wakeup
from asyncrl.proxy.worker import EngineClient, EngineWorker
from asyncrl.types import Generation, InvalidRequest, Request, TokenObserver, checked_request


class ProxyShell(abc.ABC):
    """Call bookkeeping, engine state and lifecycle common to every proxy (see the module docstring)."""

    def __init__(
        self,
        engines: Sequence[EngineClient],
        config: ProxyConfig | None,
        *,
        initial_version: int,
        clock: Callable[[], float] = time.monotonic,
        on_call_end: Callable[[EngineWorker, Request], None] | None = None,
    ) -> None:
        self.config = config or ProxyConfig()
        self._engines = EngineSet(
            engines,
            self.config,
            initial_version=initial_version,
            clock=clock,
            owner=type(self).__name__,
            on_call_end=on_call_end,
        )
        self._workers = self._engines.workers
        self._loads = LoadIndex((worker.load() for worker in self._workers), self.config.affinity_slack)
        for worker in self._workers:
            worker.on_load_change = self._load_changed
        self._affinity = AffinityTable()
        self._calls: dict[str, Any] = {}
        self._wakeup = Wakeup()
        self._health_changed = Wakeup()
        """Wakes ``engines_lost`` only when an engine is unhealthy, not on every load change (once a request)."""
        self._suspended = False
        self._closed = False
        self._latest_version = initial_version

    # ----------------------------------------------------------------------------------------- what differs

    @abc.abstractmethod
    def _new_call(self, request: Request, observe: TokenObserver | None) -> Any:
        """The proxy's own record of one ``generate`` call."""

    @abc.abstractmethod
    async def _serve(self, call: Any) -> Generation:
        """Serve one call to its end (a Generation, or an exception naming the request)."""

    def _call_ended(self, call: Any) -> None:  # noqa: B027 (an optional hook: nothing is the default)
        """A call left the table (after ``_serve`` returned or raised)."""

    @abc.abstractmethod
    def _on_load_change(self, worker: EngineWorker) -> None:
        """An engine's load changed: keep the routing index current."""

    def _notify(self) -> None:
        """Proxy state changed: re-check the waits it may have ended."""
        self._wakeup.notify()

    # ------------------------------------------------------------------------------------------ weight update

    @abc.abstractmethod
    async def suspend(self) -> None:
        """Hold new generate calls (what else it does depends on the update policy)."""

    @abc.abstractmethod
    async def model_update(self, named_tensors: Any, version: int) -> None:
        """Send weights of ``version`` (greater than any before) to the engines; needs ``suspend()`` first."""

    @abc.abstractmethod
    async def resume(self) -> None:
        """Release the calls held since ``suspend()``."""

    @abc.abstractmethod
    async def update_applied(self, version: int, timeout_s: float | None = None) -> None:
        """Wait until the engines serve ``version``; the failure of any that could not."""

    async def load_weights(self, named_tensors: Any, version: int) -> None:
        """Bring the engines to ``version`` outside a training step (a resumed trainer's weights, before any
        request): suspend → model_update → resume, then wait until it is applied.

        Why one method: the update protocol differs by policy (``in_flight`` refuses an update not preceded by
        ``suspend``; ``drain`` applies it later), so a caller that hand-rolls it for one policy breaks another.
        The controller's step runs the same sequence with its own work between suspend and update.
        """
        await self.suspend()
        try:
            await self.model_update(named_tensors, version)
        finally:
            await self.resume()
        await self.update_applied(version)

    def _load_changed(self, worker: EngineWorker) -> None:
        self._on_load_change(worker)
        if not worker.healthy:
            self._health_changed.notify()

    # ----------------------------------------------------------------------------------------------- requests

    async def generate(self, request: Request, observe: TokenObserver | None = None) -> Generation:
        """Serve ``request`` and return its output (how: the subclass's module docstring).

        ``observe`` hears the output so far while engines that can report it (``ObservableEngineClient``)
        generate; it may hear a shorter or different output after a retry from scratch, and nothing at all
        from other engines. The returned Generation is the truth."""
        self._check_open()
        request = checked_request(request)  # a bad request fails its caller here and reaches no engine
        if request.version is not None and request.version > self._latest_version:
            raise InvalidRequest(
                f"request {request.request_id}: version {request.version} is newer than the latest published "
                f"v{self._latest_version}"
            )
        if request.request_id in self._calls:
            raise ValueError(f"request {request.request_id!r} is already in flight in this proxy")
        call = self._new_call(request, observe)
        self._calls[request.request_id] = call
        try:
            return await self._serve(call)
        finally:
            del self._calls[request.request_id]
            self._call_ended(call)

    def _check_open(self) -> None:
        if self._closed:
            raise ProxyClosed(f"the {type(self).__name__} is closed")

    # ------------------------------------------------------------------------------------------ inspection

    def versions(self) -> list[int]:
        """The version each engine serves now (an engine still draining or switching reports its old one)."""
        return self._engines.versions()

    def healthy_engines(self) -> list[int]:
        """Indices of the engines that still receive requests."""
        return self._engines.healthy_engines()

    async def engines_lost(self) -> None:
        """Wait until every engine is out for good, then raise ``EnginesLost``; never returns otherwise (cancel
        it to stop watching; ``ProxyClosed`` once the proxy closes).

        Why: with no engine left every request fails at once, so a producer drops group after group (each a
        prompt consumed) while the trainer waits out its batch timeout. The controller watches this while it
        waits for a batch and stops the run instead. An engine in recovery still counts as healthy: its
        replacement may yet serve.
        """
        await self._health_changed.wait_until(
            lambda: self._closed or not any(worker.healthy for worker in self._workers)
        )
        self._check_open()
        failures = "; ".join(
            f"engine {worker.index}: {_why(worker.control_error)}" for worker in self._workers
        )
        raise EnginesLost(f"every engine is out for good ({failures})")

    def record_busy_spans(self, sink: Callable[[int, float, float], None]) -> None:
        """Report every engine's busy stretches to ``sink(index, start, end)`` (the run timeline)."""
        self._engines.record_busy_spans(sink)

    def _common_stats(self) -> dict[str, Any]:
        """Per-engine load, version, health, busy time and tokens; the proxy's state and call count."""
        return {
            "engines": self._engines.engine_stats(),
            "suspended": self._suspended,
            "latest_version": self._latest_version,
            "num_calls": len(self._calls),
        }

    # ------------------------------------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Fail every waiting call with ``ProxyClosed`` and cancel the proxy's own tasks; idempotent.

        Cancelled tasks end on the event loop's next turns; ``aclose`` waits for them.
        """
        if self._closed:
            return
        self._closed = True
        self._notify()
        self._health_changed.notify()
        self._engines.close()

    async def aclose(self) -> None:
        """``close``, then wait until the proxy's cancelled tasks (engine calls, aborts, updates) have ended, so
        no stray tracebacks appear when the runtime shuts down right after."""
        self.close()
        await self._engines.aclose()


def _why(failure: BaseException | None) -> str:
    """``failure`` with its cause: an ``EngineFailure`` names only the call that failed (``restart``), and the
    reason a replacement could not serve (a full ``/dev/shm``, no capacity) is its cause."""
    if failure is None:
        return "failed"
    cause = failure.__cause__
    return str(failure) if cause is None else f"{failure}: {type(cause).__name__}: {cause}"
