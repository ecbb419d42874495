"""Multi-version rollout (DORA): engines serve several policy versions at once, re-partitioned by pending work.

Key decision: a request is pinned to one version when it leaves the gate (the newest the window allows) and
only ever runs on engines holding that version, so each trajectory comes from exactly one version; that is
also why its KV cache can move between engines of the version with no re-prefill (engine/migration.py).
Engines only ever move forward, from a legacy version to the newest: no old weights need be kept.

```
 generate(req) ─► [gate: not suspended, a ready engine at the newest version] ─► pin version ─► least loaded
                                                                      engine of that version (or affinity's)
     engine call: request_timeout_s → abort there, RequestTimeout; raise → EngineFailure; both count against
     the engine's health; with retry_on_engine_failure the request goes back to the gate, another engine
 model_update(w, v) ─► incoming ─[window: no request of a version < v - ⌊α⌋ in flight]─► newest = v
 every change (update, window move, a request ending) ─► rebalance:
     target_partition(pending work per version)  ──►  plan_switches  ──►  per donor engine:
     export each request ─► import on a receiver of its version (KV moves) ; then donor takes the newest weights
 an engine turned unhealthy ─► its requests exported to healthy engines of their version (KV moves)
```

Back-pressure (every wait ends on the event in the last column, or on ``close()``):

| wait                   | waits for                                          | unblocked by                        |
|------------------------|----------------------------------------------------|-------------------------------------|
| held call (gate)       | not suspended, no version waiting for the window,  | ``resume()``, the window moving,    |
|                        | a ready engine at the newest version with fewer    | an engine switching or turning      |
|                        | than ``slots_per_engine`` requests (or no healthy  | unhealthy, a request ending         |
|                        | engine at all: ``NoHealthyEngine``)                |                                     |
| engine call            | the engine's Generation (continued after a move)   | its return; ``abort(id)``;          |
|                        |                                                    | ``request_timeout_s``               |
| window (``incoming``)  | no request of a version older than v - ⌊α⌋ running | those requests ending or aborted    |
| donor switch           | its requests exported and none arriving            | the exports, imports starting       |
| ``update_applied(v)``  | the window at v and one healthy engine serving v   | the above; ``timeout_s``            |

Invariants (tests/unit/proxy/test_multi_version*.py, tests/unit/controller):
1. One version per trajectory: a call is served only by engines at its pinned version; an import at another
   version is refused by the engine.
2. Window: the versions with requests in flight span at most ⌊α⌋ + 1 (``stats()["max_versions_alive"]``).
3. No trajectory is dropped by orchestration: a migration either lands on a receiver or the request stays
   where it was (export returned nothing); a request that cannot get a slot at once is prefilled again there.
4. New prompts go to the newest version; legacy versions get none, so their work only shrinks.
5. Failures: an engine unhealthy (``max_consecutive_failures`` failed or timed-out calls, or a failed control
   call) gets no new request, and the requests it holds move to healthy engines of their version while it
   still answers. A failed request reaches its caller (``EngineFailure``, ``RequestTimeout``) unless
   ``retry_on_engine_failure``: then it is generated again from scratch, on the newest version, on an engine
   that has not failed it, so its trajectory still has exactly one version.

Cost per change (a request ending, an update, a window move): the gate wakes at most as many held calls as
there are free slots at the newest version (``wakeup.HeldCalls``), and the window, the partition and the
versions alive read per-version counts kept as calls are pinned. The gate's free slots, the ready engines
per version and the engines to evacuate are tallied as each engine changes (``engine_tally``), so a change
looks at every engine only when a legacy version holds more engines than its target (then a switch is
planned) or the newest version moves. So a change costs the same with 1 k or 64 k calls in flight
(tests/unit/proxy/test_multi_version_gate.py, bench/control_plane.py), and hardly more with more engines.

Not here (unlike ``LLMProxy``): continuation of an aborted request (it would mix versions).
Shared with ``LLMProxy``-style proxies: workers, bounded engine and control calls, health (``engine_set``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.continuation import empty_abort
from asyncrl.proxy.engine_tally import EngineTally
from asyncrl.proxy.errors import EngineFailure, NoHealthyEngine, RequestTimeout
from asyncrl.proxy.shell import ProxyShell
from asyncrl.proxy.wakeup import HeldCalls
from asyncrl.proxy.worker import (
    EngineClient,
    EngineWorker,
    NamedTensors,
    PendingUpdate,
    generate_on,
    snapshot_named_tensors,
)
from asyncrl.staleness import max_policy_age
from asyncrl.types import FinishReason, Generation, Request, TokenObserver

logger = logging.getLogger(__name__)

COUNTERS = (
    "num_migrations",
    "kv_bytes_moved",
    "num_switches",
    "num_window_waits",
    "num_evacuations",
    "num_retries",
    "num_timeouts",
)
"""The orchestrator's cumulative counters in ``stats()``."""


class ExportedRequest(Protocol):
    """What the orchestrator reads of an exported request: an ``engine.migration.RequestState``, or a handle
    to one kept elsewhere (``runtime.ray_runtime.RemoteRequestState``)."""

    @property
    def request_id(self) -> str: ...

    @property
    def kv_bytes(self) -> int: ...


class MigratableEngineClient(EngineClient, Protocol):
    """An engine whose in-flight requests can leave with their state (``AsyncEngine``, ``FakeEngine``, the
    Ray engine client); ``import_request`` takes what another engine of the kind exported."""

    async def export_request(self, request_id: str) -> ExportedRequest | None: ...

    async def import_request(self, state: Any) -> Generation: ...


# ---------------------------------------------------------------------------------------------- the plan


def target_partition(loads: Mapping[int, int], num_engines: int, newest: int) -> dict[int, int]:
    """Engines per version, in proportion to pending work; the counts sum to ``num_engines``.

    Every legacy version with work keeps one engine (oldest first: its requests can run nowhere else), then the
    newest gets one, then the rest go by largest remainder of ``loads`` (ties to the newer version); with no
    work anywhere the newest takes them all. Versions without work (other than the newest) get none.
    """
    legacy = sorted(v for v, load in loads.items() if load > 0 and v != newest)
    target = dict.fromkeys([*legacy, newest], 0)
    for version in [*legacy, newest][:num_engines]:
        target[version] = 1
    remaining = num_engines - sum(target.values())
    weights = {v: loads.get(v, 0) for v in target}
    total = sum(weights.values())
    if remaining <= 0 or total == 0:
        target[newest] += max(remaining, 0)
        return target
    quotas = {v: remaining * w / total for v, w in weights.items()}
    for version, quota in quotas.items():
        target[version] += int(quota)
    leftover = remaining - sum(int(q) for q in quotas.values())
    by_remainder = sorted(quotas, key=lambda v: (quotas[v] - int(quotas[v]), v), reverse=True)
    for version in by_remainder[:leftover]:
        target[version] += 1
    return target


@dataclass(frozen=True, kw_only=True)
class EngineView:
    """One ready engine as the planner sees it."""

    index: int
    version: int
    num_requests: int
    """Requests on it or arriving at it (migrations under way)."""


@dataclass(frozen=True, kw_only=True)
class Switch:
    """Move engine ``index`` to the newest version after sending its requests to ``moves`` (receiver, count)."""

    index: int
    moves: tuple[tuple[int, int], ...]


def plan_switches(
    engines: Sequence[EngineView], target: Mapping[int, int], newest: int, slots_per_engine: int | None
) -> list[Switch]:
    """Which legacy engines to hand to the newest version, and where their requests go.

    Per legacy version with more engines than its target, the engines with the fewest requests are donors
    (fewest bytes moved); their requests fill the least-loaded remaining engines of that version up to
    ``slots_per_engine`` (None: no limit). A donor whose requests do not fit stays, and so do those after it.
    """
    switches = []
    for version in sorted({e.version for e in engines if e.version < newest}):
        group = sorted((e for e in engines if e.version == version), key=lambda e: (e.num_requests, e.index))
        surplus = len(group) - target.get(version, 0)
        receivers = {e.index: e.num_requests for e in group[max(surplus, 0) :]}
        for donor in group[: max(surplus, 0)]:
            moves = _fill(receivers, donor.num_requests, slots_per_engine)
            if moves is None:
                break
            switches.append(Switch(index=donor.index, moves=moves))
    return switches


def has_surplus(ready_at: Mapping[int, int], target: Mapping[int, int], newest: int) -> bool:
    """Whether some legacy version has more ready engines (``ready_at``: per version) than its target: only
    then may ``plan_switches`` return a switch, so a change where none has need not look at the engines."""
    return any(count > target.get(version, 0) for version, count in ready_at.items() if version < newest)


def _fill(receivers: dict[int, int], count: int, slots: int | None) -> tuple[tuple[int, int], ...] | None:
    """Place ``count`` requests one by one on the least-loaded receiver (updating ``receivers``); None if they
    do not all fit, leaving ``receivers`` unchanged."""
    loads = dict(receivers)
    placed = _place(loads, count, slots)
    if sum(placed.values()) < count:
        return None
    receivers.update(loads)
    return tuple(sorted(placed.items()))


def _fill_some(receivers: Mapping[int, int], count: int, slots: int | None) -> tuple[tuple[int, int], ...]:
    """Like ``_fill``, but places as many of the ``count`` requests as fit (receivers unchanged)."""
    return tuple(sorted(_place(dict(receivers), count, slots).items()))


def _place(loads: dict[int, int], count: int, slots: int | None) -> Counter[int]:
    """Up to ``count`` requests, one by one on the least-loaded receiver with room; ``loads`` is updated."""
    placed: Counter[int] = Counter()
    for _ in range(count):
        room = [i for i, n in loads.items() if slots is None or n < slots]
        if not room:
            break
        best = min(room, key=lambda i: (loads[i], i))
        loads[best] += 1
        placed[best] += 1
    return placed


# ------------------------------------------------------------------------------------------- the proxy


def _importer(state: ExportedRequest) -> Callable[[EngineWorker], Awaitable[Generation]]:
    """The engine call that continues a migrated request on its receiver."""

    def run(engine: EngineWorker) -> Awaitable[Generation]:
        return engine.client.import_request(state)

    return run


@dataclass(kw_only=True)
class _Call:
    """One ``generate`` call: held while ``version`` is None, then on ``worker`` (or between two, migrating)."""

    request: Request
    version: int | None = None
    worker: EngineWorker | None = None
    abort_requested: bool = False
    handoff: asyncio.Future[tuple[EngineWorker, ExportedRequest] | None] | None = None
    """Set while the call is being exported: resolves to its receiver and state, or None if it stayed."""
    excluded: set[int] = field(default_factory=set)
    """Engines that failed this call (a retry goes elsewhere)."""
    observe: TokenObserver | None = None
    """Hears the output so far on the first engine of a dispatch (a migrated request's rest comes whole)."""


class MultiVersionProxy(ProxyShell):
    """The ``LLMProxy`` seam (generate, abort, suspend, model_update, resume, update_applied) for DORA-style
    multi-version rollout over migratable engines (contract: module docstring)."""

    def __init__(
        self,
        engines: Sequence[MigratableEngineClient],
        config: ProxyConfig | None = None,
        *,
        async_ratio: float = 0.0,
        slots_per_engine: int | None = None,
        initial_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots_per_engine is not None and slots_per_engine < 1:
            raise ValueError(f"slots_per_engine must be >= 1 or None, got {slots_per_engine}")
        self.slots_per_engine = slots_per_engine
        self._arriving: Counter[int] = Counter()
        """Requests migrating to each engine (by index); changed only through ``_arrive``."""
        self._newest = initial_version
        self._tally = EngineTally(len(engines), slots_per_engine)
        """Gate slots, ready engines per version, sick engines: kept per engine change (``_on_load_change``,
        ``_arrive``), rebuilt when the newest version moves."""
        super().__init__(engines, config, initial_version=initial_version, clock=clock)
        self._tally.rebuild(self._workers, self._arriving, self._newest)
        self.max_age = max_policy_age(async_ratio)
        self._weights: PendingUpdate | None = None
        self._incoming: PendingUpdate | None = None
        self._counts = Counter(dict.fromkeys(COUNTERS, 0))
        self._max_versions_alive = 1
        self._held = HeldCalls()
        """Calls at the gate: each change wakes as many as there are free slots at the newest version."""
        self._num_pinned: Counter[int] = Counter()
        """Calls pinned to each version (no zero counts): the window and the partition read it per change."""
        self._on_engine: dict[int, dict[str, _Call]] = {}
        """The calls running on each engine (by index), the ones a switch or an evacuation moves."""

    # ----------------------------------------------------------------------------------------------- requests

    def _new_call(self, request: Request, observe: TokenObserver | None) -> _Call:
        return _Call(request=request, observe=observe)

    def _call_ended(self, call: _Call) -> None:
        self._forget_handoff(call)
        self._pin(call, None)
        self._changed()

    def _pin(self, call: _Call, version: int | None) -> None:
        """Set the call's version, keeping the per-version counts current."""
        if call.version is not None:
            self._num_pinned[call.version] -= 1
            if not self._num_pinned[call.version]:
                del self._num_pinned[call.version]
        call.version = version
        if version is not None:
            self._num_pinned[version] += 1

    async def abort(self, request_id: str) -> Generation | None:
        """End a request now: its partial Generation from the engine (or held: an empty one); None if unknown
        or it ended meanwhile. Its ``generate`` returns with ``finish_reason="abort"`` too."""
        call = self._calls.get(request_id)
        if call is None or call.abort_requested:
            return None
        call.abort_requested = True
        self._held.wake(request_id)
        if call.version is None:
            return empty_abort(call.request)
        worker = call.worker
        if worker is None:  # between two engines: the serve loop sees the flag and stops there
            return None
        return await self._engines.control(worker, "abort", request_id, request_id=request_id)

    async def _serve(self, call: _Call) -> Generation:
        """Dispatch, run (following migrations), and on an engine failure retry from the gate if allowed."""
        while True:
            worker = await self._dispatch(call)
            if worker is None:
                return empty_abort(call.request)
            try:
                return await self._run(call, worker)
            except (EngineFailure, RequestTimeout) as failure:
                if not self._may_retry(call):
                    raise
                self._forget_handoff(call)
                call.excluded.add(failure.engine_index)
                self._pin(call, None)  # generated again from scratch, on the newest version: one version
                self._counts["num_retries"] += 1
                logger.warning("request %s: %s; retrying on another engine", call.request.request_id, failure)

    async def _dispatch(self, call: _Call) -> EngineWorker | None:
        """Hold the call at the gate, then pin it to the newest version; its engine, or None if aborted."""
        await self._held.wait_until(
            call.request.request_id,
            lambda: self._closed or call.abort_requested or self._dispatchable(call),
            shared=not call.excluded,
        )
        self._check_open()
        if call.abort_requested:
            return None
        self._pin(call, self._newest)
        return self._route(call, self._newest)

    async def _run(self, call: _Call, worker: EngineWorker) -> Generation:
        """The engine calls of one dispatch: on ``worker``, then on each receiver it migrates to."""
        request = replace(call.request, version=call.version)

        def run(engine: EngineWorker) -> Awaitable[Generation]:
            return generate_on(engine.client, request, call.observe)

        while True:
            generation = await self._attempt(call, worker, request, run)
            target = await self._take_handoff(call)
            if target is None or generation.finish_reason is not FinishReason.ABORT or call.abort_requested:
                return generation
            worker, state = target
            run = _importer(state)

    async def _attempt(
        self,
        call: _Call,
        worker: EngineWorker,
        request: Request,
        run: Callable[[EngineWorker], Awaitable[Generation]],
    ) -> Generation:
        call.worker = worker
        self._on_engine.setdefault(worker.index, {})[request.request_id] = call
        self._affinity.add(request.affinity_key, worker.index)
        try:
            return await self._engines.attempt(worker, request, lambda: run(worker))
        except RequestTimeout:
            self._counts["num_timeouts"] += 1
            raise
        finally:
            self._affinity.remove(request.affinity_key, worker.index)
            del self._on_engine[worker.index][request.request_id]
            call.worker = None
            self._changed()

    async def _take_handoff(self, call: _Call) -> tuple[EngineWorker, ExportedRequest] | None:
        if call.handoff is None:
            return None
        target = await call.handoff
        call.handoff = None
        if target is not None:
            self._arrive(target[0], -1)
        return target

    def _forget_handoff(self, call: _Call) -> None:
        """A call that ends (e.g. cancelled) mid-migration no longer arrives at its receiver."""
        handoff, call.handoff = call.handoff, None
        if handoff is None:
            return

        def release(done: asyncio.Future[tuple[EngineWorker, ExportedRequest] | None]) -> None:
            if not done.cancelled() and done.result() is not None:
                self._arrive(done.result()[0], -1)
                self._changed()

        handoff.add_done_callback(release)

    def _may_retry(self, call: _Call) -> bool:
        if not self.config.retry_on_engine_failure or call.abort_requested or self._closed:
            return False
        return any(w.healthy and w.index not in call.excluded for w in self._workers)

    def _dispatchable(self, call: _Call) -> bool:
        """New work starts only on the newest weights: not while a newer version waits for the window.
        With no healthy engine left the call goes on, to fail with ``NoHealthyEngine``."""
        if not any(w.healthy and w.index not in call.excluded for w in self._workers):
            return True
        if self._suspended or self._incoming is not None:
            return False
        return self._route(call, self._newest, required=False) is not None

    def _route(self, call: _Call, version: int, *, required: bool = True) -> EngineWorker | None:
        """The least-loaded ready engine at ``version`` with a free slot (the engine serving the call's
        affinity key if close).

        The index ranks ready engines before those with an update pending, so a non-ready choice means no
        ready engine serves ``version``. Without the slot check, every call held through a weight update
        would go to the first engine to reach the new version and queue there while the engines switching
        after it sat idle (found by the simulator: 40 % engine busy time instead of 71 %).
        """
        excluded = frozenset(call.excluded)
        owner = self._affinity.owner(call.request.affinity_key)
        index = self._loads.choose(affinity_owner=owner, pinned_version=version, excluded=excluded)
        if index is not None and owner is not None and not self._has_slot(index):
            index = self._loads.choose(pinned_version=version, excluded=excluded)  # the owner is full
        if index is not None and not (self._workers[index].ready and self._has_slot(index)):
            index = None
        if index is None and required:
            raise NoHealthyEngine(f"request {call.request.request_id!r}: no healthy engine serves v{version}")
        return None if index is None else self._workers[index]

    def _has_slot(self, index: int) -> bool:
        """Engine ``index`` holds (or is about to receive) fewer than ``slots_per_engine`` requests."""
        if self.slots_per_engine is None:
            return True
        return len(self._workers[index].in_flight) + self._arriving[index] < self.slots_per_engine

    def _on_load_change(self, worker: EngineWorker) -> None:
        self._loads.update(worker.load())
        self._tally.update(worker, self._arriving[worker.index], self._newest)

    def _arrive(self, worker: EngineWorker, count: int) -> None:
        """``count`` more (or fewer) requests are migrating to ``worker``."""
        self._arriving[worker.index] += count
        self._tally.update(worker, self._arriving[worker.index], self._newest)

    # ------------------------------------------------------------------------------------------ weight update

    async def suspend(self) -> None:
        """Hold new generate calls at the gate; requests on engines keep running on their own version."""
        self._check_open()
        self._suspended = True

    async def model_update(self, named_tensors: NamedTensors, version: int) -> None:
        """Take weights of ``version`` (snapshotted now); they become the newest once the window allows."""
        self._check_open()
        if version <= self._latest_version:
            raise ValueError(f"model_update: version must exceed {self._latest_version}, got {version}")
        self._latest_version = version
        self._incoming = PendingUpdate(named_tensors=snapshot_named_tensors(named_tensors), version=version)
        if not self._window_open():
            self._counts["num_window_waits"] += 1
        self._changed()

    async def resume(self) -> None:
        self._check_open()
        self._suspended = False
        self._notify()

    async def update_applied(self, version: int, timeout_s: float | None = None) -> None:
        """Wait until ``version`` is the newest and at least one healthy engine serves it."""
        if version > self._latest_version:
            raise ValueError(
                f"update_applied: version {version} was never sent (latest {self._latest_version})"
            )

        def served() -> bool:
            return self._newest >= version and any(w.healthy and w.version >= version for w in self._workers)

        def settled() -> bool:
            failed = self._engines.control_failure() is not None
            return self._closed or served() or failed or not self.healthy_engines()

        try:
            await asyncio.wait_for(self._wakeup.wait_until(settled), timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            raise TimeoutError(f"version {version} not serving after {timeout_s} s: {self.stats()}") from None
        self._check_open()
        if served():
            return
        failure = self._engines.control_failure()
        if failure is not None:
            raise failure
        raise NoHealthyEngine(f"no healthy engine serves version {version}")

    # ---------------------------------------------------------------------------------------- orchestration

    def _changed(self) -> None:
        """After any change: move the window if it may, re-partition, wake the waiters."""
        if self._incoming is not None and self._window_open() and not self._closed:
            self._weights, self._incoming = self._incoming, None
            self._newest = self._weights.version
            self._tally.rebuild(self._workers, self._arriving, self._newest)
        self._rebalance()
        self._evacuate_unhealthy()
        alive = self.versions_alive()
        self._max_versions_alive = max(self._max_versions_alive, alive[-1] - alive[0] + 1)
        self._notify()

    def _notify(self) -> None:
        """Wake the waits a change may have ended: the few broadcast ones, and at the gate only as many held
        calls as can move now."""
        self._wakeup.notify()
        capacity = self._gate_capacity()
        self._held.notify(capacity != 0, limit=capacity)

    def _gate_capacity(self) -> int | None:
        """How many held calls (with no engine excluded) may leave the gate now; None: all of them.

        Every such call that ``_dispatchable`` lets go needs a free slot on a ready, healthy engine at the
        newest version, so this is never 0 when one could go (no wake-up is lost). O(1): the free slots are
        tallied as engines change (``EngineTally``).
        """
        if self._closed:
            return None  # each call goes on, to ProxyClosed
        return self._tally.gate_capacity(not self._suspended and self._incoming is None)

    def _window_open(self) -> bool:
        """The incoming version may become the newest: no request older than the window it opens runs."""
        assert self._incoming is not None
        return min(self._num_pinned, default=self._incoming.version) >= self._incoming.version - self.max_age

    def _rebalance(self) -> None:
        """Hand surplus legacy engines to the newest version; while no legacy version has a surplus
        (``has_surplus``, most changes) the tally answers in O(versions) and the engines are not looked at."""
        if self._weights is None or self._closed:
            return
        if min(self._tally.ready_at, default=self._newest) >= self._newest:
            return  # no legacy engine: nothing to hand over
        loads = Counter(self._num_pinned)
        loads[self._newest] += len(self._calls) - sum(self._num_pinned.values())
        target = target_partition(loads, self._tally.num_usable, self._newest)
        if not has_surplus(self._tally.ready_at, target, self._newest):
            return
        views = self._views(self._usable())
        for switch in plan_switches(views, target, self._newest, self.slots_per_engine):
            self._start_switch(self._workers[switch.index], switch.moves)

    def _usable(self) -> list[EngineWorker]:
        """Engines that take new work: healthy, and whose control calls have not failed."""
        return [w for w in self._workers if w.healthy and w.control_error is None]

    def _views(self, workers: Sequence[EngineWorker]) -> list[EngineView]:
        """What the planner sees of the ready ones among ``workers``: requests on or heading to each."""
        return [
            EngineView(
                index=w.index, version=w.version, num_requests=len(w.in_flight) + self._arriving[w.index]
            )
            for w in workers
            if w.ready
        ]

    def _start_switch(self, donor: EngineWorker, moves: tuple[tuple[int, int], ...]) -> None:
        """Send the donor's requests to their receivers, then give it the newest weights (in the background)."""
        assert self._weights is not None
        donor.pending = self._weights
        self._send_requests(donor, moves)
        self._counts["num_switches"] += 1
        self._engines.spawn(self._switch(donor))

    def _evacuate_unhealthy(self) -> None:
        """Move the requests of an engine marked unhealthy (that still answers) to healthy engines of their
        version, KV included; a request with nowhere to go stays and finishes where it is."""
        if self._closed or not self._tally.sick:
            return
        healthy = self._views(self._usable())
        for worker in [self._workers[index] for index in sorted(self._tally.sick)]:
            receivers = {v.index: v.num_requests for v in healthy if v.version == worker.version}
            moves = _fill_some(receivers, len(self._movable(worker)), self.slots_per_engine)
            self._counts["num_evacuations"] += self._send_requests(worker, moves)

    def _movable(self, worker: EngineWorker) -> list[_Call]:
        return [c for c in self._on_engine.get(worker.index, {}).values() if c.handoff is None]

    def _send_requests(self, donor: EngineWorker, moves: tuple[tuple[int, int], ...]) -> int:
        """Start migrating the donor's requests to ``moves`` (receiver, count); how many were started."""
        receivers = [self._workers[index] for index, count in moves for _ in range(count)]
        pairs = list(zip(self._movable(donor), receivers, strict=False))  # calls may have ended meanwhile
        for call, receiver in pairs:
            call.handoff = handoff = asyncio.get_running_loop().create_future()
            self._arrive(receiver, 1)
            self._engines.spawn(self._migrate(call, handoff, donor, receiver))
        return len(pairs)

    async def _migrate(
        self,
        call: _Call,
        handoff: asyncio.Future[tuple[EngineWorker, ExportedRequest] | None],
        donor: EngineWorker,
        receiver: EngineWorker,
    ) -> None:
        """Export the call's request from the donor and resolve ``handoff`` (its own future, passed in: a call
        that ends before this task starts has already let go of ``call.handoff``, and the receiver's arrival
        count must still be given back)."""
        target = None
        try:
            rid = call.request.request_id
            state = await self._engines.control(donor, "export_request", rid, request_id=rid)
            if state is not None:
                target = (receiver, state)
                self._counts["num_migrations"] += 1
                self._counts["kv_bytes_moved"] += state.kv_bytes
        except EngineFailure as failure:
            logger.warning("%s: %r; the request stays on engine %d", failure, failure.__cause__, donor.index)
        finally:
            if handoff.done():  # the call was cancelled while it waited for the move: it arrives nowhere
                target = None
            else:
                handoff.set_result(target)
            if target is None:
                self._arrive(receiver, -1)
                self._changed()

    async def _switch(self, donor: EngineWorker) -> None:
        """Once nothing runs on or heads to the donor, load the newest weights into it."""
        await self._wakeup.wait_until(
            lambda: self._closed or not (donor.in_flight or self._arriving[donor.index])
        )
        if self._closed:
            return
        update = self._weights
        assert update is not None
        donor.pending, donor.applying = None, update.version
        try:
            await self._engines.control(donor, "pause")
            await self._engines.control(donor, "update_weights", update.named_tensors, update.version)
            await self._engines.control(donor, "resume")
        except EngineFailure as failure:
            self._engines.mark_unhealthy(donor, failure)
        else:
            donor.version = update.version
        finally:
            donor.applying = None
            self._changed()

    # ------------------------------------------------------------------------------------------ inspection

    def versions_alive(self) -> list[int]:
        """Versions with requests in flight, plus the newest: the window the engines serve now."""
        return sorted({*self._num_pinned, self._newest})

    def stats(self) -> dict[str, Any]:
        """Per-engine state and the orchestration metrics: migrations, KV bytes moved, versions alive."""
        return {
            **self._common_stats(),
            "newest_version": self._newest,
            "versions_alive": len(self.versions_alive()),
            "max_versions_alive": self._max_versions_alive,
            "num_held": len(self._calls) - sum(self._num_pinned.values()),
            "num_gate_wakeups": self._held.num_wakeups,
            **self._counts,
        }
