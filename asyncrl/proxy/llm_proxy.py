"""LLMProxy: one ``await generate(request)`` over N engine workers, and the weight-update protocol across them.

Key decision: the proxy owns every wait. A request is *held* at the proxy (suspended, or every engine it may
use is draining) or *on an engine* (one engine call in flight); nothing else. Both states end on a named event.
Every routing decision and wake-up costs O(log engines), not O(engines) or O(held calls): engine loads live
in an index updated as they change (``routing.LoadIndex``) and a state change wakes only the held calls it
may release (``wakeup.HeldCalls``): under ``drain``'s slot cap, at most the free slots on ready engines
(``engine_tally``), so each held call is woken about once, which keeps a simulated cluster of thousands of
accelerators linear (tests/unit/proxy/test_proxy_drain_gate.py).

```
 callers ── generate(req) ──► [admission gate]──► routing ──► engine call ──► Generation ──► caller
   ▲                            │ held while         │ least loaded,   │ timeout → abort, RequestTimeout
   │                            │ suspended or       │ newest ready,   │ raise  → EngineFailure (+health)
   │                            │ target draining    │ affinity, pin   │ unasked abort (in_flight policy)
   │                            ▼                    ▼                 └─► continuation: prefix = output so
   └─ abort(id) ──────────► wake held call / abort on its engine            far, back to the gate ──┘
 controller ── suspend() ─► gate closed (in_flight: pause every engine)
            ── model_update(w, v) ─► in_flight: update every paused engine now
                                     drain: snapshot w; each engine applies it once its calls have returned
            ── resume() ─► (in_flight: resume engines) gate open;  update_applied(v) ─► waits for the drains
```

Back-pressure (every wait ends on the event in the last column, or on ``close()`` with ``ProxyClosed``):

| wait                        | waits for                                | unblocked by                      |
|-----------------------------|------------------------------------------|-----------------------------------|
| held call (admission)       | proxy not suspended, routed engine ready | ``resume()``, an update landing,  |
|                             |                                          | ``abort(id)``, a health change    |
| engine call                 | the engine's Generation                  | its return; ``request_timeout_s``;|
|                             |                                          | caller cancel (abort sent after)  |
| drain (per engine)          | that engine's in-flight calls returned   | each call's return (timeouts)     |
| control call (pause/update/ | the engine's answer                      | answer, or ``control_timeout_s``  |
| resume/abort)               |                                          | → engine unhealthy                |
| ``update_applied(v)``       | every healthy engine at version >= v     | updates landing, failures, timeout|

Invariants (tests/unit/proxy):
1. Every ``generate`` call ends exactly once: a Generation, or an exception naming the request
   (``EngineFailure``, ``RequestTimeout``, ``NoHealthyEngine``, ``ProxyClosed``). An abort the caller did
   not ask for is continued under ``in_flight`` and returned as is under ``drain`` (a continuation there
   would mix versions).
2. ``drain`` policy: an engine never receives a request while an update is pending or being applied on
   it, and applies an update only with no call in flight, so every Generation carries one version.
3. ``in_flight`` policy: a caller never sees an abort it did not ask for (within ``max_continuations``);
   the stitched Generation equals the concatenation of its pieces, versions non-decreasing.
4. No silent re-run: a failed engine call is re-run elsewhere only with ``retry_on_engine_failure``, or
   with recovery on (``enable_recovery``) while its engine is probed or replaced; always on an engine
   whose version the proxy knows (a replacement only once it holds the latest update), counted.
5. Weight ownership: in ``drain`` the proxy snapshots (clones) the weights inside ``model_update`` before it
   returns, so the trainer may keep updating its tensors in place; in ``in_flight`` every engine holds the
   update before ``model_update`` returns, so no copy is made.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from asyncrl.config.proxy import ProxyConfig
from asyncrl.proxy.continuation import check_continued, continuation_request, empty_abort, needs_continuation
from asyncrl.proxy.engine_tally import EngineTally
from asyncrl.proxy.errors import EngineFailure, NoHealthyEngine, RequestTimeout
from asyncrl.proxy.recovery import EngineFactory, EngineRecovery, Readable, as_published
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
from asyncrl.types import FinishReason, Generation, Request, TokenObserver
from asyncrl.weight_sync.protocol import WeightUpdate
from asyncrl.weight_sync.receiver import InPlaceReceiver

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class _Call:
    """One ``generate`` call: held at the proxy when ``task`` is None, else on engine ``worker``."""

    request: Request
    abort_requested: bool = False
    worker: EngineWorker | None = None
    task: asyncio.Task[Generation] | None = None
    partial: Generation | None = None
    """Output so far, from engine calls that ended in an abort the caller did not ask for."""
    num_continuations: int = 0
    num_retries: int = 0
    excluded: set[int] = field(default_factory=set)
    """Engines that failed this call (skipped by retries)."""
    chosen: int | None = None
    """The engine routing chose when the call last found it submittable (see ``_submittable``)."""
    observe: TokenObserver | None = None
    """Hears the output so far (a continuation's includes the earlier pieces: the engine stitches them)."""


class LLMProxy(ProxyShell):
    """Routes requests over engine workers and moves them to new weights (contract: module docstring)."""

    def __init__(
        self,
        engines: Sequence[EngineClient],
        config: ProxyConfig | None = None,
        *,
        initial_version: int = 0,
        slots_per_engine: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            engines, config, initial_version=initial_version, clock=clock, on_call_end=self._on_call_end
        )
        self.update_policy = self.config.update_policy or "drain"
        slots = slots_per_engine if self.update_policy == "drain" else None
        # a call sent beyond the engine's slots only queues there, and a drain would wait for that queue
        for worker in self._workers:
            worker.max_in_flight = slots
        self._tally = EngineTally(len(self._workers), slots)
        """Free slots on ready engines of any version: a change wakes at most that many held calls."""
        self._tally.rebuild(self._workers, {}, None)
        self._held = HeldCalls()
        self._updating = False
        self._counts = {"num_continuations": 0, "num_retries": 0, "num_timeouts": 0}
        self._initial_version = initial_version
        self._latest_update: PendingUpdate | None = None
        """The last update published, kept for engines that replace failed ones (``enable_recovery``)."""
        self._recovery: EngineRecovery | None = None

    def enable_recovery(self, factory: EngineFactory, readable: Readable = as_published) -> None:
        """Replace dead or wedged engines with ones ``factory`` starts (see ``proxy.recovery``; ``readable``:
        what a replacement applies in place of the latest update); call it on the event loop the proxy
        serves."""
        if self._recovery is None and self.config.max_engine_restarts > 0:
            self._recovery = EngineRecovery(
                self._engines,
                factory,
                initial_version=self._initial_version,
                latest_update=lambda: self._latest_update,
                on_recovered=self._on_recovered,
                wait_until=self._wakeup.wait_until,
                readable=readable,
            )

    # ----------------------------------------------------------------------------------------------- requests

    def _new_call(self, request: Request, observe: TokenObserver | None) -> _Call:
        return _Call(request=request, observe=observe)

    async def abort(self, request_id: str) -> Generation | None:
        """End a request now; its partial Generation, or None if it is not in flight here.

        Exactly when the call's own ``generate`` returns a Generation with finish_reason ``abort``, this returns
        an equal one; when the request ended otherwise at the same moment (stop, length, failure), None.
        """
        call = self._calls.get(request_id)
        if call is None or call.abort_requested:
            return None
        call.abort_requested = True
        self._held.wake(request_id)
        self._notify()
        task, worker = call.task, call.worker
        if task is None or worker is None:
            return replace(self._held_abort_result(call))
        if not task.done():
            partial = await self._engines.control(worker, "abort", request_id, request_id=request_id)
            await asyncio.wait({task}, timeout=self.config.control_timeout_s)  # let the engine call return
            if not task.done():
                return partial
        return _abort_result_of(task)

    async def _serve(self, call: _Call) -> Generation:
        while True:
            worker = await self._acquire_engine(call)
            if worker is None:
                return self._held_abort_result(call)
            try:
                generation = await self._attempt(call, worker)
            except EngineFailure:
                if not self._may_retry(call, worker):
                    raise
                if self._recovery is None:  # recovery brings the engine back at a known version, or drops it
                    call.excluded.add(worker.index)
                call.num_retries += 1
                self._counts["num_retries"] += 1
                continue
            if not self._continues(call, generation):
                return generation
            call.partial = generation
            call.num_continuations += 1
            self._counts["num_continuations"] += 1

    async def _acquire_engine(self, call: _Call) -> EngineWorker | None:
        """Hold the call until an engine may take it now; that engine, or None if the caller aborted meanwhile.

        The caller starts the engine call without awaiting in between, so the engine is still ready then.
        """
        await self._held.wait_until(
            call.request.request_id,
            lambda: self._closed or call.abort_requested or self._submittable(call),
            shared=call.request.version is None and not call.excluded,
        )
        self._check_open()
        if call.abort_requested:
            return None
        return self._route(call)

    def _submittable(self, call: _Call) -> bool:
        """Whether the engine routing chooses for ``call`` (kept in ``call.chosen``) takes it now; ``_route``
        runs right after a true answer, with no await between, so the choice is still current there."""
        if self._suspended:
            return False
        call.chosen = self._choose(call, call.excluded)
        return call.chosen is None or self._workers[call.chosen].ready

    def _shared_submittable(self) -> bool:
        """``_submittable`` of every call that is neither pinned nor excluding engines: the routed engine is
        the best one or ties with it on readiness (affinity never crosses readiness), so one check serves all."""
        if self._closed:
            return True
        best = self._loads.best_load()
        return not self._suspended and (best is None or best.ready)

    def _choose(self, call: _Call, excluded: set[int]) -> int | None:
        return self._loads.choose(
            affinity_owner=self._affinity.owner(call.request.affinity_key),
            pinned_version=call.request.version,
            excluded=frozenset(excluded),
        )

    def _route(self, call: _Call) -> EngineWorker:
        index = call.chosen
        if index is None:
            pin = "" if call.request.version is None else f" at version {call.request.version}"
            raise NoHealthyEngine(f"request {call.request.request_id!r}: no healthy engine{pin} can serve it")
        return self._workers[index]

    async def _attempt(self, call: _Call, worker: EngineWorker) -> Generation:
        """One engine call; synchronous up to the first await, so the routed engine is still ready when counted."""
        assert worker.ready and not self._suspended, "submitting to an engine that is not ready"
        request = continuation_request(call.request, call.partial)
        task = self._engines.start(
            worker, request, lambda: _generate_continued(worker, request, call.observe)
        )
        self._affinity.add(request.affinity_key, worker.index)
        call.worker, call.task = worker, task
        try:
            return await self._engines.await_call(worker, task, request.request_id)
        except RequestTimeout:
            self._counts["num_timeouts"] += 1
            self._notify()
            raise
        finally:
            call.worker, call.task = None, None

    def _on_call_end(self, worker: EngineWorker, request: Request) -> None:
        """An engine call stopped counting in flight: its affinity ends and its engine may have drained."""
        self._affinity.remove(request.affinity_key, worker.index)
        self._maybe_apply(worker)
        self._notify()

    def _continues(self, call: _Call, generation: Generation) -> bool:
        return (
            self.update_policy == "in_flight"
            and not call.abort_requested
            and call.num_continuations < self.config.max_continuations
            and needs_continuation(generation, call.request)
        )

    def _may_retry(self, call: _Call, failed: EngineWorker) -> bool:
        """Whether a call its engine failed is served again: under recovery unless the engine is out for good
        (at most ``max_consecutive_failures`` times, so a request that breaks every engine ends), else with
        ``retry_on_engine_failure`` on another engine."""
        if call.abort_requested or self._closed:
            return False
        if self._recovery is not None and (failed.recovering or failed.healthy):
            return call.num_retries < self.config.max_consecutive_failures
        if not self.config.retry_on_engine_failure:
            return False
        return self._choose(call, call.excluded | {failed.index}) is not None

    def _held_abort_result(self, call: _Call) -> Generation:
        return call.partial if call.partial is not None else empty_abort(call.request)

    # ------------------------------------------------------------------------------------------ weight update

    async def suspend(self, *, engines_asleep: bool = False) -> None:
        """Hold new generate calls at the proxy; ``in_flight`` policy: also pause the engines.

        ``engines_asleep``: the engines are about to sleep (``runtime.switch``, the controller before such a
        step): until ``resume`` the calls already on them do not run down ``request_timeout_s``
        (``EngineSet.hold_timeouts``), since they cannot progress and it is no engine's fault. Not for every
        suspension: under ``drain`` the engines go on serving, and a drain awaited while suspended must still
        see a hung engine's calls time out."""
        self._check_open()
        self._suspended = True
        if engines_asleep:
            self._engines.hold_timeouts(True)
        self._notify()
        if self.update_policy == "in_flight":
            await self._on_reachable_engines(lambda worker: self._engines.control(worker, "pause"))

    async def model_update(self, named_tensors: NamedTensors, version: int) -> None:
        """Send weights of ``version`` (greater than any before) to every engine that still answers.

        ``in_flight``: needs ``suspend()`` first; returns once every engine holds the update.
        ``drain``: snapshots the weights and returns at once; each engine applies them after its in-flight
        calls have returned (await ``update_applied(version)`` to wait for that).
        """
        self._check_open()
        if version <= self._latest_version:
            raise ValueError(f"model_update: version must exceed {self._latest_version}, got {version}")
        self._prefetch(named_tensors)
        if self.update_policy == "drain":
            self._latest_version = version
            update = PendingUpdate(named_tensors=snapshot_named_tensors(named_tensors), version=version)
            self._latest_update = update
            self._schedule_drain(update)
            return
        if not self._suspended or self._updating:
            raise RuntimeError(
                "update_policy 'in_flight': call suspend() before model_update(), one at a time"
            )
        self._latest_version = version
        payload = _in_flight_payload(named_tensors)
        self._latest_update = PendingUpdate(named_tensors=payload, version=version)
        await self._update_in_flight(payload, version)

    def _prefetch(self, update: Any) -> None:
        """Engines that read an update ahead (the delta transport) start now, while they still generate; a
        failed prefetch only costs the read again when the update is applied."""
        if not InPlaceReceiver.handles(update):
            return
        for worker in self._workers:
            if worker.control_error is None and hasattr(worker.client, "prefetch_weights"):
                self._engines.spawn(self._prefetch_on(worker, update))

    async def _prefetch_on(self, worker: EngineWorker, update: WeightUpdate) -> None:
        try:
            timeout_s = self.config.update_timeout_s(update.nbytes)
            await asyncio.wait_for(worker.client.prefetch_weights(update), timeout_s)
        except Exception as error:  # deliberate: the apply fetches again and reports a real failure
            logger.warning("engine %d: prefetch of v%d failed (%r)", worker.index, update.version, error)

    async def resume(self) -> None:
        """``in_flight`` policy: resume the engines; then release the held generate calls."""
        self._check_open()
        try:
            if self.update_policy == "in_flight":
                await self._on_reachable_engines(lambda worker: self._engines.control(worker, "resume"))
        finally:
            self._suspended = False
            self._engines.hold_timeouts(False)
            self._notify()

    async def update_applied(self, version: int, timeout_s: float | None = None) -> None:
        """Wait until every healthy engine serves ``version`` or newer; the failure of any that could not."""
        if version > self._latest_version:
            raise ValueError(
                f"update_applied: version {version} was never sent (latest {self._latest_version})"
            )
        try:
            settled = self._wakeup.wait_until(lambda: self._closed or self._update_settled(version))
            await asyncio.wait_for(settled, timeout_s)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
            lagging = [w.index for w in self._workers if w.healthy and w.version < version]
            raise TimeoutError(
                f"version {version} not applied after {timeout_s} s on engines {lagging}"
            ) from None
        self._check_open()
        failure = self._engines.control_failure(older_than=version)
        if failure is not None:
            raise failure
        if not self.healthy_engines():
            raise NoHealthyEngine(f"no healthy engine serves version {version}")

    def _update_settled(self, version: int) -> bool:
        return all(worker.version >= version or not worker.healthy for worker in self._workers)

    async def _update_in_flight(self, named_tensors: Any, version: int) -> None:
        async def update(worker: EngineWorker) -> None:
            await self._engines.control(worker, "update_weights", named_tensors, version)
            worker.version = version

        self._updating = True
        try:
            await self._on_reachable_engines(update)
        finally:
            self._updating = False

    def _schedule_drain(self, update: PendingUpdate) -> None:
        for worker in self._workers:
            if worker.control_error is None:
                worker.pending = update
                self._maybe_apply(worker)
        self._notify()

    def _maybe_apply(self, worker: EngineWorker) -> None:
        """Start applying ``worker``'s pending update if it has drained (no call in flight, nothing applying,
        not recovering: a replacement is brought to the latest update by the recovery itself)."""
        if (
            worker.pending is None
            or worker.in_flight
            or worker.applying is not None
            or worker.recovering
            or self._closed
        ):
            return
        update, worker.pending = worker.pending, None
        worker.applying = update.version
        self._engines.spawn(self._apply(worker, update))

    async def _apply(self, worker: EngineWorker, update: PendingUpdate) -> None:
        """pause → update → resume on the worker's engine; if the engine is replaced meanwhile (recovery),
        the rest is left to the recovery, which brings the new engine to the latest update."""
        client = worker.client
        steps = [("pause",), ("update_weights", update.named_tensors, update.version), ("resume",)]
        failure: EngineFailure | None = None
        try:
            for operation, *args in steps:
                if worker.client is not client:
                    break
                await self._engines.control(worker, operation, *args)
        except EngineFailure as error:
            failure = error
        if worker.client is not client:
            return
        if failure is not None:
            self._engines.mark_unhealthy(worker, failure)
        else:
            worker.version = update.version
        worker.applying = None
        self._maybe_apply(worker)
        self._notify()

    def _on_recovered(self, worker: EngineWorker) -> None:
        """A worker left recovery (replaced or not): a newer pending update may apply, held calls may go."""
        self._maybe_apply(worker)
        self._notify()

    # ---------------------------------------------------------------------------------------------- control

    async def _on_reachable_engines(self, action: Callable[[EngineWorker], Coroutine[Any, Any, Any]]) -> None:
        """Run ``action`` on every engine whose control calls work, at once; first error raised.

        An engine made unhealthy by failing *requests* is still paused, updated and resumed, so calls it still
        holds never stay paused and its version stays known; one whose control call fails is dropped for good,
        or (recovery on) replaced: its failure is then not raised, and engines in recovery are skipped. A
        failure of an engine the recovery already replaced meanwhile (it died mid-call, and its requests' failures
        got it replaced first) concerns the old engine only: the replacement is not marked.
        """
        workers = [w for w in self._workers if w.control_error is None and not w.recovering]
        clients = [worker.client for worker in workers]
        results = await asyncio.gather(*(action(worker) for worker in workers), return_exceptions=True)
        failures = [
            (w, r)
            for w, client, r in zip(workers, clients, results, strict=True)
            if isinstance(r, BaseException) and w.client is client
        ]
        for worker, failure in failures:
            self._engines.mark_unhealthy(worker, failure)
        self._notify()
        unrecovered = [failure for worker, failure in failures if not worker.recovering]
        if unrecovered:
            raise unrecovered[0]

    def _on_load_change(self, worker: EngineWorker) -> None:
        self._loads.update(worker.load())
        self._tally.update(worker, 0, None)

    def _notify(self) -> None:
        """Proxy state changed: re-check the waits it may have ended, waking only as many held calls as can
        take a slot now (each takes one on its routed engine, a ready one: ``_shared_submittable``)."""
        self._wakeup.notify()
        capacity = None if self._closed else self._tally.gate_capacity(not self._suspended)
        self._held.notify(self._shared_submittable(), limit=capacity)

    # ------------------------------------------------------------------------------------------ inspection

    def stats(self) -> dict[str, Any]:
        """Per-engine load, version, health, busy time, idle fraction and tokens; proxy-wide counts."""
        recovery = {} if self._recovery is None else self._recovery.counts
        return {
            **self._common_stats(),
            "num_held": sum(1 for call in self._calls.values() if call.task is None),
            **self._counts,
            "num_reclaimed": self._engines.num_reclaimed,
            "num_gate_wakeups": self._held.num_wakeups,
            **recovery,
        }


async def _generate_continued(
    worker: EngineWorker, request: Request, observe: TokenObserver | None
) -> Generation:
    """The engine's Generation for ``request``; ``ValueError`` if it does not continue the request's prefix."""
    generation = await generate_on(worker.client, request, observe)
    check_continued(generation, request)
    return generation


def _items(named_tensors: NamedTensors) -> Any:
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def _in_flight_payload(named_tensors: NamedTensors | WeightUpdate) -> Any:
    """What every paused engine receives now: a ``WeightUpdate`` as is, named tensors as one dict."""
    return named_tensors if isinstance(named_tensors, WeightUpdate) else dict(_items(named_tensors))


def _abort_result_of(task: asyncio.Task[Generation]) -> Generation | None:
    """The aborted Generation a finished engine call returned, None if it ended otherwise."""
    if task.cancelled() or task.exception() is not None:
        return None
    generation = task.result()
    return generation if generation.finish_reason is FinishReason.ABORT else None
