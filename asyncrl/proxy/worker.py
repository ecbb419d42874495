"""The proxy's view of one engine: the ``EngineClient`` seam and the bookkeeping the proxy keeps beside it.

``EngineClient`` is exactly what the proxy calls: the in-process ``AsyncEngine`` and the Ray actor workers
both provide it. ``EngineWorker`` is plain state (no awaits): in-flight requests, the served and pending
versions, health, and busy time for the idle fraction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from asyncrl.proxy.routing import EngineLoad
from asyncrl.types import Generation, Request, TokenObserver
from asyncrl.weight_sync.protocol import WeightUpdate

NamedTensors = Mapping[str, Any] | Iterable[tuple[str, Any]]


class EngineClient(Protocol):
    """One engine replica as the proxy drives it.

    ``generate`` returns when the request ends: stop, length, or abort (``finish_reason="abort"``, partial
    output) when ``abort`` is called or the engine drops it. A request with a prefix resumes after it and its
    generation starts with it (see proxy/continuation.py). In-flight requests may survive ``update_weights``;
    every token carries the version of the weights that produced it.
    """

    async def generate(self, request: Request) -> Generation: ...

    async def abort(self, request_id: str) -> Generation | None: ...

    async def pause(self) -> None: ...

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None: ...

    async def resume(self) -> None: ...


@runtime_checkable
class ObservableEngineClient(Protocol):
    """An engine that can also report a request's output as it is sampled (the built-in engine does), so the
    endpoint streams tokens as they come; other engines' results arrive whole, as one piece."""

    async def generate_observed(self, request: Request, observe: TokenObserver) -> Generation: ...


async def generate_on(client: EngineClient, request: Request, observe: TokenObserver | None) -> Generation:
    """``client.generate(request)``, observed token by token when asked and the engine can report progress."""
    if observe is not None and isinstance(client, ObservableEngineClient):
        return await client.generate_observed(request, observe)
    return await client.generate(request)


@dataclass(frozen=True, kw_only=True)
class PendingUpdate:
    """Weights waiting for an engine to drain: an immutable snapshot (see ``snapshot_named_tensors``)."""

    named_tensors: Mapping[str, Any]
    version: int


def snapshot_named_tensors(named_tensors: NamedTensors) -> dict[str, Any]:
    """A copy of the weights the caller may keep mutating: tensors are cloned, numpy arrays copied.

    Values with neither ``clone`` nor ``copy`` (e.g. Ray object refs, bytes) are immutable and kept as is, and
    so is a ``WeightUpdate`` (the transports' record, immutable once published).
    """
    if isinstance(named_tensors, WeightUpdate):  # immutable once published: nothing to copy
        return named_tensors
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    return {name: _copy_value(value) for name, value in items}


def _copy_value(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "clone"):
        return value.detach().clone()
    if hasattr(value, "copy") and hasattr(value, "shape"):
        return value.copy()
    return value


_LOAD_FIELDS = frozenset(
    {"version", "pending", "applying", "healthy", "recovering", "num_in_flight_tokens", "control_error"}
)
"""Fields that change ``EngineWorker.load()`` (``start``/``finish`` change ``in_flight`` and then the tokens),
or whether the engine may take work (``control_error``, read by ``engine_tally``)."""


@dataclass(kw_only=True)
class EngineWorker:
    """Proxy-side state of engine ``index``; mutated only by the proxy, on its event loop.

    ``on_load_change(worker)`` runs after every assignment that changes ``load()`` or ``control_error``,
    wherever it happens, so an index kept beside the workers (``routing.LoadIndex``, ``engine_tally``) cannot
    miss a change.
    """

    index: int
    client: EngineClient
    version: int
    started_at: float
    healthy: bool = True
    consecutive_failures: int = 0
    in_flight: dict[int, int] = field(default_factory=dict)
    """attempt id (one per engine call) → tokens its request may occupy (prompt + max_new_tokens)."""
    num_in_flight_tokens: int = 0
    """Sum of ``in_flight``'s values, kept incrementally: routing reads it for every held call on every wake."""
    pending: PendingUpdate | None = None
    applying: int | None = None
    """Version being applied right now (drain policy), None otherwise."""
    control_error: BaseException | None = None
    """Why a pause / update / resume failed on this engine (it is then unhealthy at an unknown version)."""
    recovering: bool = False
    """Being probed after a failure, or replaced (``proxy.recovery``): it takes no new request meanwhile."""
    updates_in_flight: int = 0
    """Weight updates this engine is applying now: the health patrol leaves it alone meanwhile (an engine
    busy loading weights may answer nothing else), the update's own deadline watches it instead."""
    num_updates_started: int = 0
    """Weight updates ever started on this engine: a probe that overlapped one proves nothing."""
    num_restarts: int = 0
    """Times this engine was replaced by a fresh one."""
    max_in_flight: int | None = None
    """Most calls sent to this engine at once (its slots: ``LLMProxy``'s ``slots_per_engine`` under ``drain``);
    more wait at the proxy, so an update drains only what the engine runs, not a queue behind it. None: no cap."""
    busy_seconds: float = 0.0
    busy_since: float | None = None
    request_seconds: float = 0.0
    """Requests in flight integrated over time, up to ``counted_until``: its difference over a window divided
    by the window is the engine's mean concurrency then, the number a decode batch can be at most (an
    engine that is never idle may still be starved of requests)."""
    counted_until: float = field(init=False, default=0.0)
    """When ``request_seconds`` was last brought up to date (from ``started_at`` on)."""
    total_tokens: int = 0
    num_requests: int = 0
    num_failures: int = 0
    on_load_change: Callable[[EngineWorker], None] | None = field(default=None, repr=False, compare=False)
    on_busy_span: Callable[[int, float, float], None] | None = field(default=None, repr=False, compare=False)
    """Called with (index, start, end) each time the engine goes idle after a busy stretch (run timelines)."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _LOAD_FIELDS and self.on_load_change is not None:
            self.on_load_change(self)

    @property
    def ready(self) -> bool:
        """``settled`` and below ``max_in_flight``: a request sent now starts at once, on ``version``."""
        under_cap = self.max_in_flight is None or len(self.in_flight) < self.max_in_flight
        return self.settled and under_cap

    @property
    def settled(self) -> bool:
        """No update is pending or being applied and no recovery is under way."""
        return self.pending is None and self.applying is None and not self.recovering

    @property
    def effective_version(self) -> int:
        """The version this engine will serve next: that of its pending or applying update, else its own."""
        if self.pending is not None:
            return self.pending.version
        return self.applying if self.applying is not None else self.version

    def load(self) -> EngineLoad:
        return EngineLoad(
            index=self.index,
            num_in_flight=len(self.in_flight),
            num_in_flight_tokens=self.num_in_flight_tokens,
            version=self.effective_version,
            ready=self.ready,
            healthy=self.healthy,
        )

    def start(self, attempt_id: int, request: Request, now: float) -> None:
        """Count engine call ``attempt_id`` (serving ``request``) as in flight on this engine from ``now``."""
        self._count_requests(now)
        if not self.in_flight:
            self.busy_since = now
        num_tokens = len(request.prompt_token_ids) + request.sampling.max_new_tokens
        self.in_flight[attempt_id] = num_tokens
        self.num_in_flight_tokens += num_tokens
        self.num_requests += 1

    def finish(self, attempt_id: int, now: float) -> bool:
        """Engine call ``attempt_id`` returned, failed or was abandoned; False if it was already finished."""
        if attempt_id not in self.in_flight:
            return False
        self._count_requests(now)
        num_tokens = self.in_flight.pop(attempt_id)
        self.num_in_flight_tokens -= num_tokens
        if not self.in_flight and self.busy_since is not None:
            self.busy_seconds += now - self.busy_since
            if self.on_busy_span is not None:
                self.on_busy_span(self.index, self.busy_since, now)
            self.busy_since = None
        return True

    def record_failure(self, max_consecutive_failures: int) -> None:
        """Count a failed call; past ``max_consecutive_failures`` in a row the engine is unhealthy, unless a
        recovery is already under way (it decides: the engine comes back, replaced or not, or stays out)."""
        self.num_failures += 1
        self.consecutive_failures += 1
        if self.consecutive_failures >= max_consecutive_failures and not self.recovering:
            self.healthy = False

    def record_success(self) -> None:
        self.consecutive_failures = 0

    def __post_init__(self) -> None:
        self.counted_until = self.started_at

    def _count_requests(self, now: float) -> None:
        self.request_seconds = self.request_time(now)
        self.counted_until = now

    def request_time(self, now: float) -> float:
        """Request-seconds in flight on this engine since the proxy started (``request_seconds`` up to ``now``)."""
        return self.request_seconds + len(self.in_flight) * (now - self.counted_until)

    def busy_time(self, now: float) -> float:
        """Seconds since the proxy started during which this engine had at least one request in flight."""
        return self.busy_seconds + (now - self.busy_since if self.busy_since is not None else 0.0)

    def idle_fraction(self, now: float) -> float:
        """Share of the time since the proxy started during which this engine had no request in flight."""
        elapsed = now - self.started_at
        return 0.0 if elapsed <= 0 else 1.0 - self.busy_time(now) / elapsed

    def mean_in_flight(self, now: float) -> float:
        """Mean requests in flight on this engine since the proxy started."""
        elapsed = now - self.started_at
        return 0.0 if elapsed <= 0 else self.request_time(now) / elapsed

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "index": self.index,
            "healthy": self.healthy,
            "version": self.version,
            "pending_version": None if self.settled else self.effective_version,
            "in_flight": len(self.in_flight),
            "in_flight_tokens": self.num_in_flight_tokens,
            "busy_seconds": self.busy_time(now),
            "request_seconds": self.request_time(now),
            "mean_in_flight": self.mean_in_flight(now),
            "idle_fraction": self.idle_fraction(now),
            "total_tokens": self.total_tokens,
            "num_requests": self.num_requests,
            "num_failures": self.num_failures,
            "num_restarts": self.num_restarts,
        }
