"""A cost-model engine behind the real ``EngineClient`` seam: continuous batching on the loop's (virtual) clock.

Key decision: event-driven, not token-driven. The running batch changes only at step boundaries (a request
joins, finishes, is aborted, or the engine pauses), so the engine plans a *segment* — steps until its first
running request finishes — and sets one timer at its end (``asyncrl.sim.cost``). A change that arrives
mid-segment shortens the segment to the end of the step in progress, as a real engine admits new requests
and applies aborts between steps. A request's life: waiting (FIFO, admitted when a slot and its KV
reservation are free, by the real engine's ``AdmissionPolicy``) → running → finished (stop or length) | aborted (partial output returned) | exported.

With ``engine.kv_allocation: paged`` (vLLM, SGLang) nothing is reserved: a request is admitted when its
context so far fits what the running batch leaves of the KV budget, the batch's KV grows by one token per
running request each step (a segment also ends where the next step would not fit), and the most recently
admitted request is then preempted back to the head of the queue, to be prefilled again (recompute): with the
prefix cache (``engine.prefix_caching``, the default) only the part of its KV that allocations reused meanwhile.

Multi-version streaming (``asyncrl.proxy.multi_version``) moves requests between engines of one version:
``export_request`` takes a request out between steps (its caller gets the partial output, aborted) as a
``SimRequestState``; ``import_request`` continues it elsewhere after ``kv_transfer_s_per_token`` per context
token, *joining* the next step with its KV (no prefill) when a slot and its reservation are free at once, as
the real engine places it ahead of the waiting queue; otherwise it waits and is prefilled again.

Each token carries the version of the weights that made it, so in-flight updates (``pause`` →
``update_weights`` → ``resume``) produce multi-version generations exactly as the real engine does.

Bookkeeping is O(log running) per request, not O(running) per segment: the engine counts its steps, and a
running request's output is ``produced + (steps - since_step)`` until it leaves; requests wait in a heap by
the step at which they finish; KV tokens are a running sum. Only a version change touches every running
request (once per weight update), to close its run of tokens at the old version.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.sim import SimEngineConfig
from asyncrl.engine.admission import AdmissionPolicy
from asyncrl.metrics.timeline import Timeline
from asyncrl.rle import RleSequence
from asyncrl.sim import cost
from asyncrl.types import FinishReason, Generation, Request

TOKEN_ID = 0
TOKEN_LOGPROB = -1.0


@dataclass(frozen=True, kw_only=True)
class SimRequestState:
    """What a ``SimEngine`` exports and another continues (the ``ExportedRequest`` of the multi-version
    proxy); the simulated counterpart of ``asyncrl.engine.migration.RequestState``."""

    request: Request
    produced: int
    """Output tokens so far, prefix included."""
    version_runs: tuple[tuple[int, int], ...]
    """(version, count) runs of the tokens made after the prefix."""
    target: int
    """Output tokens at which the request ends (its sampling state travels with it: it ends as if it stayed)."""
    version: int
    """The version of the engine it left: only an engine at this version may continue it."""
    kv_tokens: int
    """Context tokens whose KV moves with it (0: it had none, e.g. still waiting, and is prefilled again)."""
    kv_bytes: int
    """``kv_tokens`` x ``engine.kv_bytes_per_token``."""

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(eq=False)
class _SimRequest:
    request: Request
    result: asyncio.Future[Generation]
    target: int
    """Output tokens (prefix included) at which the request ends."""
    produced: int
    """Output tokens (prefix included) as of engine step ``since_step``; while running, one more per step."""
    reservation: int
    since_step: int = 0
    new_versions: list[list[int]] = field(default_factory=list)
    """[version, count] runs of the tokens made here (after the prefix), up to ``since_step``."""
    prefill_tokens: int = 0
    """Context tokens to prefill in the next step (the prompt on admission, everything after a recompute)."""
    finish_step: int = 0
    """The engine step at which a running request reaches ``target``."""
    cached_until: int | None = None
    """Preempted with ``engine.prefix_caching``: the engine's allocation count (``SimEngine._allocated``) after
    which allocations start reusing this request's freed KV; None when it holds none in the cache."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)


class _Requests:
    """An ordered set of requests (FIFO for the waiting queue, admission order for the running batch) in which
    the first with a given id is found, and any one removed, in O(1): an abort or export finds its request
    without a scan (a partial-rollout step aborts thousands of requests, each once, most of them queued)."""

    def __init__(self) -> None:
        self._order: OrderedDict[_SimRequest, None] = OrderedDict()
        self._by_id: dict[str, dict[_SimRequest, None]] = {}
        """Each id's requests, in order (an ordered set: a continued request may meet its earlier self)."""

    def add(self, seq: _SimRequest) -> None:
        self._order[seq] = None
        self._by_id.setdefault(seq.request.request_id, {})[seq] = None

    def remove(self, seq: _SimRequest) -> None:
        del self._order[seq]
        same_id = self._by_id[seq.request.request_id]
        del same_id[seq]
        if not same_id:
            del self._by_id[seq.request.request_id]

    def find(self, request_id: str) -> _SimRequest | None:
        """The first request with this id."""
        return next(iter(self._by_id.get(request_id, ())), None)

    def first(self) -> _SimRequest:
        return next(iter(self._order))

    def last(self) -> _SimRequest:
        return next(reversed(self._order))

    def appendleft(self, seq: _SimRequest) -> None:
        """Put ``seq`` first (a preempted request goes back to the head of the queue)."""
        self.add(seq)
        self._order.move_to_end(seq, last=False)

    def popleft(self) -> _SimRequest:
        seq = self.first()
        self.remove(seq)
        return seq

    def clear(self) -> None:
        self._order.clear()
        self._by_id.clear()

    def __contains__(self, seq: object) -> bool:
        return seq in self._order

    def __iter__(self) -> Iterator[_SimRequest]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


@dataclass
class _Segment:
    """Steps planned for a fixed running batch, from ``start`` until its timer."""

    start: float
    num_running: int
    num_kv_tokens: int
    prefill_s: float
    num_steps: int
    timer: asyncio.TimerHandle


class SimEngine:
    """Simulated engine replica (see the module docstring); ``length_of(request_id)`` gives the output
    tokens a request would generate if nothing stopped it (capped by its ``max_new_tokens``)."""

    def __init__(
        self,
        config: SimEngineConfig,
        length_of: Callable[[str], int],
        *,
        name: str = "engine0",
        timeline: Timeline | None = None,
        version: int = 0,
    ) -> None:
        self.config = config
        self.policy = AdmissionPolicy(
            max_running_requests=config.max_running_requests,
            max_kv_tokens=config.max_kv_tokens,
            max_model_len=config.max_model_len,
        )
        """Admission shared with the real engine; prefill is unchunked (the cost model prefills a request's
        whole context in the step it joins)."""
        self.length_of = length_of
        self.name = name
        self.timeline = timeline or Timeline(enabled=False)
        self.version = version
        self.paused = False
        self.waiting = _Requests()
        """Requests waiting for admission, FIFO."""
        self.running = _Requests()
        """Running requests in admission order."""
        self.joining = _Requests()
        """Imported requests with their KV and reservation, starting at the next step (before the queue)."""
        self.kv_reserved = 0
        self._step = 0
        """Decode steps this engine has run."""
        self._runs_version = version
        """The version the running requests' tokens since their ``since_step`` were made at."""
        self._finishing: list[tuple[int, int, _SimRequest]] = []
        """Heap of (finish step, admission number, request); entries of requests that left are skipped."""
        self._admissions = itertools.count()
        self._kv_base = 0
        """Sum over running requests of prompt + produced - since_step: their KV tokens minus steps x count."""
        self._allocated = 0
        """KV tokens allocated so far (contexts on admission, a token per running request per step): the
        position in the free-block queue that ``_SimRequest.cached_until`` is measured against."""
        self._prefill_pending: list[_SimRequest] = []
        self._segment: _Segment | None = None
        self._busy_since: float | None = None
        self._kick_scheduled = False
        self._pending_aborts: dict[str, asyncio.Future[Generation | None]] = {}
        self._pending_exports: dict[str, asyncio.Future[SimRequestState | None]] = {}
        self._in_transit: dict[str, _SimRequest] = {}
        """Imported requests whose KV is still on its way, by id."""
        self._pause_waiters: list[asyncio.Future[None]] = []
        self.paged = config.kv_allocation == "paged"
        """KV allocated as contexts grow, with preemption (``SimEngineConfig.kv_allocation``)."""
        self.counts = dict.fromkeys(
            ("preempted", "recomputed_tokens", "cached_tokens", "requests", "tokens", "segments", "aborted")
            + ("updates", "exported", "imported"),
            0,
        )

    @property
    def generating(self) -> bool:
        """Requests are decoding now (what the trainer's ``concurrent_slowdown`` contends with)."""
        return bool(self.running) and not self.paused

    # ---- EngineClient ----------------------------------------------------------------------------------

    async def generate(self, request: Request) -> Generation:
        loop = asyncio.get_running_loop()
        produced = len(request.prefix_token_ids)
        target = max(produced, min(self.length_of(request.request_id), self._max_output(request)))
        seq = _SimRequest(request, loop.create_future(), target, produced, self._reservation(request))
        self.counts["requests"] += 1
        if produced >= target:
            return self._generation(seq, self._end_reason(seq))
        seq.prefill_tokens = seq.num_prompt_tokens + produced
        self.waiting.add(seq)
        self._kick()
        return await seq.result  # a cancelled caller cancels only this future: the request runs on, unread

    async def abort(self, request_id: str) -> Generation | None:
        seq = self._take_queued(request_id)
        if seq is not None:
            return self._finish(seq, FinishReason.ABORT)
        seq = self.running.find(request_id)
        if seq is None:
            return None
        if self._segment is None:  # paused: no step in progress
            return self._finish(seq, FinishReason.ABORT)
        return await self._at_step_end(self._pending_aborts, request_id)

    async def export_request(self, request_id: str) -> SimRequestState | None:
        """Take a request out, between steps if it is running: its ``generate`` returns the partial output
        (aborted) and the state continues it on an engine of this version; None if unknown or ended."""
        seq = self._take_queued(request_id)
        if seq is not None:
            return self._export(seq)
        seq = self.running.find(request_id)
        if seq is None:
            return None
        if self._segment is None:
            return self._export(seq)
        return await self._at_step_end(self._pending_exports, request_id)

    async def import_request(self, state: SimRequestState) -> Generation:
        """Continue an exported request from its output so far (its Generation holds every token); only at
        the version it was exported from. Its KV arrives after the transfer time; it then joins the next
        step without prefill if a slot and its reservation are free, else waits and is prefilled again."""
        if state.version != self.version:
            raise ValueError(
                f"request {state.request_id}: exported at v{state.version}, engine {self.name} at v{self.version}"
            )
        runs = [list(run) for run in state.version_runs]
        result = asyncio.get_running_loop().create_future()
        reservation = self._reservation(state.request)
        seq = _SimRequest(state.request, result, state.target, state.produced, reservation, new_versions=runs)
        self.counts["imported"] += 1
        if not await self._transfer(seq, state.kv_tokens * self.config.kv_transfer_s_per_token):
            return await seq.result  # aborted or exported again on its way here
        if state.kv_tokens and self._fits_now(seq):
            self.kv_reserved += seq.reservation
            self.joining.add(seq)
        else:
            seq.prefill_tokens = seq.num_prompt_tokens + seq.produced
            self.waiting.add(seq)
        self._kick()
        return await seq.result

    async def _transfer(self, seq: _SimRequest, transfer_s: float) -> bool:
        """Wait while ``seq``'s KV arrives (``abort`` and ``export_request`` find it meanwhile); whether it
        is still here to join."""
        if not transfer_s:
            return True
        request_id = seq.request.request_id
        self._in_transit[request_id] = seq
        try:
            await asyncio.wait([seq.result], timeout=transfer_s)  # done early if taken out meanwhile
        finally:
            arrived = self._in_transit.pop(request_id, None) is seq
        return arrived

    async def pause(self) -> None:
        self.paused = True
        if self._segment is None:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._pause_waiters.append(waiter)
        self._shorten()
        await waiter

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(self.config.weight_update_s)
        self.timeline.add(self.name, start, loop.time(), "update")
        self.version = version
        self.counts["updates"] += 1
        if self.config.recompute_kv_on_update:
            for seq in self.running:
                seq.prefill_tokens = self._context(seq)
            self._prefill_pending = list(self.running)

    async def resume(self) -> None:
        self.paused = False
        self._kick()

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "running": len(self.running),
            "waiting": len(self.waiting),
            "joining": len(self.joining),
            "busy_s": self.timeline.busy_s[self.name],
            **self.counts,
        }

    # ---- the step loop, one segment at a time -------------------------------------------------------

    def _kick(self) -> None:
        """Re-plan soon: once per loop iteration, so requests arriving together join the same step."""
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._on_kick)

    def _on_kick(self) -> None:
        self._kick_scheduled = False
        if self._segment is None:
            if not self.paused:
                self._plan()
        elif self._has_admittable():
            self._shorten()

    def _shorten(self) -> None:
        """End the running segment at the end of the step in progress (changes apply between steps)."""
        segment = self._segment
        assert segment is not None
        loop = asyncio.get_running_loop()
        elapsed = loop.time() - segment.start
        done = cost.steps_done(
            self.config,
            segment.num_running,
            segment.num_kv_tokens,
            elapsed,
            segment.num_steps,
            segment.prefill_s,
        )
        num_steps = min(segment.num_steps, done + 1)
        if num_steps == segment.num_steps:
            return
        segment.num_steps = num_steps
        segment.timer.cancel()
        end = segment.start + self._segment_s(segment, num_steps)
        segment.timer = loop.call_at(end, self._on_boundary)

    def _on_boundary(self) -> None:
        """The segment's last step ended: commit its tokens, finish and abort, pause or plan the next one."""
        segment = self._segment
        assert segment is not None
        self._segment = None
        self._advance(segment.num_steps)
        while self._finishing and self._finishing[0][0] <= self._step:
            entry = heapq.heappop(self._finishing)
            if self._live(entry):  # not a preempted request's former entry
                seq = entry[2]
                self._finish(seq, self._end_reason(seq))
        self._apply_aborts()
        self._apply_exports()
        if self.paused:
            self._go_idle()
            waiters, self._pause_waiters = self._pause_waiters, []
            for waiter in waiters:
                waiter.set_result(None)
            return
        self._plan()

    def _plan(self) -> None:
        self._admit()
        loop = asyncio.get_running_loop()
        if not self.running:
            self._go_idle()
            return
        prefill_tokens, num_kv, num_steps = self._take_batch_totals()
        now = loop.time()
        if self._busy_since is None:
            self._busy_since = now
        prefill_s = cost.prefill_s(self.config, prefill_tokens)
        segment_s = cost.segment_s(self.config, len(self.running), num_kv, num_steps, prefill_s)
        timer = loop.call_at(now + segment_s, self._on_boundary)
        self._segment = _Segment(now, len(self.running), num_kv, prefill_s, num_steps, timer)
        self.counts["segments"] += 1

    def _take_batch_totals(self) -> tuple[int, int, int]:
        """Prefill tokens due (cleared: paid in this segment), KV tokens, and steps until the first request
        ends, of the running batch."""
        prefill_tokens = 0
        for seq in self._prefill_pending:
            if seq in self.running:
                prefill_tokens += seq.prefill_tokens
                seq.prefill_tokens = 0
        self._prefill_pending = []
        while not self._live(self._finishing[0]):
            heapq.heappop(self._finishing)
        num_kv = self._kv_now()
        num_steps = self._finishing[0][0] - self._step
        if self.paged:  # until the next step would outgrow the KV budget (then a preemption)
            room = (self.config.max_kv_tokens - num_kv) // len(self.running)
            num_steps = max(1, min(num_steps, room))
        return prefill_tokens, num_kv, num_steps

    def _live(self, entry: tuple[int, int, _SimRequest]) -> bool:
        """A ``_finishing`` entry of a running request (not one that left, nor a preempted one's former)."""
        step, _, seq = entry
        return seq in self.running and seq.finish_step == step

    def _kv_now(self) -> int:
        """KV tokens the running batch holds now (as of the last step boundary)."""
        return self._kv_base + self._step * len(self.running)

    def _paged_fits(self, context: int, num_running: int, kv_tokens: int) -> bool:
        """Paged KV: a slot is free beside ``num_running`` and ``context`` more tokens on top of ``kv_tokens``
        leave room for the next step (one token per running request)."""
        budget = self.config.max_kv_tokens
        return (
            num_running < self.policy.max_running_requests and kv_tokens + context + num_running + 1 <= budget
        )

    def _preempt_overflow(self) -> None:
        """Paged KV: while the next step would not fit, the most recently admitted running request gives its
        KV back and returns to the head of the queue, its context to be prefilled again (recompute).

        With ``prefix_caching`` its freed blocks stay cached behind the blocks already free (vLLM's free queue
        hands out the least recently freed first, a request's last blocks before its first), so allocations
        reuse them only once the free space ahead of them is spent: ``cached_until``."""
        budget = self.config.max_kv_tokens
        while len(self.running) > 1 and (kv_now := self._kv_now()) + len(self.running) > budget:
            seq = self.running.last()
            self._release(seq)
            seq.prefill_tokens = self._context_of(seq)
            if self.config.prefix_caching:
                seq.cached_until = self._allocated + max(0, budget - kv_now)
            self.waiting.appendleft(seq)
            self.counts["preempted"] += 1

    def _recompute_tokens(self, seq: _SimRequest) -> int:
        """Context tokens a request preempted with ``prefix_caching`` prefills again on readmission: those that
        allocations since its preemption reused (its last ones first); the rest are read from the cache."""
        assert seq.cached_until is not None
        context = self._context_of(seq)
        reused = min(context, max(0, self._allocated - seq.cached_until))
        seq.cached_until = None
        self.counts["recomputed_tokens"] += reused
        self.counts["cached_tokens"] += context - reused
        return reused

    def _segment_s(self, segment: _Segment, num_steps: int) -> float:
        return cost.segment_s(
            self.config, segment.num_running, segment.num_kv_tokens, num_steps, segment.prefill_s
        )

    def _advance(self, num_steps: int) -> None:
        """Every running request made ``num_steps`` tokens at the current version (the version at the end
        of the segment, as a real engine applies an update between steps)."""
        if self.version != self._runs_version:
            for seq in self.running:
                self._settle(seq)
            self._runs_version = self.version
        self._step += num_steps
        self.counts["tokens"] += num_steps * len(self.running)
        self._allocated += num_steps * len(self.running)

    def _settle(self, seq: _SimRequest) -> None:
        """Bring ``seq.produced`` and its version runs up to the current step."""
        num_new = self._step - seq.since_step
        if num_new:
            runs = seq.new_versions
            if runs and runs[-1][0] == self._runs_version:
                runs[-1][1] += num_new
            else:
                runs.append([self._runs_version, num_new])
            seq.produced += num_new
            seq.since_step = self._step

    @staticmethod
    def _context_of(seq: _SimRequest) -> int:
        """KV tokens a request not running holds once admitted: prompt and output so far."""
        return seq.num_prompt_tokens + seq.produced

    def _context(self, seq: _SimRequest) -> int:
        """KV tokens of a running request now: prompt and output so far."""
        return seq.num_prompt_tokens + seq.produced + self._step - seq.since_step

    def _admit(self) -> None:
        for seq in self.joining:  # their reservations were taken on import
            self._start_running(seq)
        self.joining.clear()
        if self.paged:
            self._preempt_overflow()
            while self.waiting and self._paged_fits(
                self._context_of(self.waiting.first()), len(self.running), self._kv_now()
            ):
                head = self.waiting.popleft()
                self.kv_reserved += head.reservation
                self._start_running(head)
            return
        num_admitted = self.policy.num_admitted(
            (seq.reservation for seq in self.waiting),
            num_running=len(self.running),
            kv_reserved=self.kv_reserved,
        )
        for _ in range(num_admitted):
            head = self.waiting.popleft()
            self.kv_reserved += head.reservation
            self._start_running(head)

    def _start_running(self, seq: _SimRequest) -> None:
        if seq.cached_until is not None:  # a preempted request back: what the cache kept is not prefilled
            seq.prefill_tokens = self._recompute_tokens(seq)
        self._allocated += seq.num_prompt_tokens + seq.produced
        seq.since_step = self._step
        seq.finish_step = self._step + seq.target - seq.produced
        self.running.add(seq)
        heapq.heappush(self._finishing, (seq.finish_step, next(self._admissions), seq))
        self._kv_base += seq.num_prompt_tokens + seq.produced - seq.since_step
        if seq.prefill_tokens:
            self._prefill_pending.append(seq)

    def _has_admittable(self) -> bool:
        if self.joining:
            return True
        if self.paged:
            return bool(self.waiting) and self._paged_fits(
                self._context_of(self.waiting.first()), len(self.running), self._kv_now()
            )
        return bool(self.waiting) and self.policy.admits(
            num_running=len(self.running),
            kv_reserved=self.kv_reserved,
            reservation=self.waiting.first().reservation,
        )

    def _apply_aborts(self) -> None:
        pending, self._pending_aborts = self._pending_aborts, {}
        for request_id, waiter in pending.items():
            seq = self.running.find(request_id)
            waiter.set_result(None if seq is None else self._finish(seq, FinishReason.ABORT))

    def _apply_exports(self) -> None:
        pending, self._pending_exports = self._pending_exports, {}
        for request_id, waiter in pending.items():
            seq = self.running.find(request_id)
            waiter.set_result(None if seq is None else self._export(seq))

    def _go_idle(self) -> None:
        if self._busy_since is not None:
            self.timeline.add(self.name, self._busy_since, asyncio.get_running_loop().time(), "generate")
            self._busy_since = None

    # ---- requests arriving and leaving ---------------------------------------------------------------

    def _reservation(self, request: Request) -> int:
        """KV tokens a request reserves (``AdmissionPolicy.reservation``; ``max_new_tokens`` counts a
        continuation's prefix); an error naming it if it can never fit."""
        reservation = self.policy.reservation(len(request.prompt_token_ids), request.sampling.max_new_tokens)
        self.policy.check_fits(request.request_id, reservation)
        return reservation

    def _max_output(self, request: Request) -> int:
        """Output tokens (prefix included) at which a request ends with ``length``: ``max_new_tokens``, or
        where its context reaches ``max_model_len``, as on the real engine."""
        if self.policy.max_model_len is None:
            return request.sampling.max_new_tokens
        return min(request.sampling.max_new_tokens, self.policy.max_model_len - len(request.prompt_token_ids))

    def _fits_now(self, seq: _SimRequest) -> bool:
        """A slot and ``seq``'s reservation are free now, counting the requests already joining."""
        num_running = len(self.running) + len(self.joining)
        if self.paged:
            joining_kv = sum(self._context_of(other) for other in self.joining)
            return self._paged_fits(self._context_of(seq), num_running, self._kv_now() + joining_kv)
        return self.policy.admits(
            num_running=num_running, kv_reserved=self.kv_reserved, reservation=seq.reservation
        )

    async def _at_step_end(self, pending: dict[str, asyncio.Future[Any]], request_id: str) -> Any:
        """Wait for the end of the step in progress, where ``pending``'s change to ``request_id`` applies."""
        waiter = pending.get(request_id)
        if waiter is None:
            waiter = pending[request_id] = asyncio.get_running_loop().create_future()
            self._shorten()
        return await asyncio.shield(waiter)

    def _take_queued(self, request_id: str) -> _SimRequest | None:
        """Remove an arriving, joining or waiting request with this id (a joining one gives back its
        reservation)."""
        if request_id in self._in_transit:
            return self._in_transit.pop(request_id)
        seq = self.joining.find(request_id)
        if seq is not None:
            self.joining.remove(seq)
            self.kv_reserved -= seq.reservation
            return seq
        seq = self.waiting.find(request_id)
        if seq is not None:
            self.waiting.remove(seq)
        return seq

    def _export(self, seq: _SimRequest) -> SimRequestState:
        """End ``seq`` here as exported; its KV goes with it unless it is due to be prefilled (waiting)."""
        self._release(seq)
        self.counts["exported"] += 1
        self._resolve(seq, FinishReason.ABORT)
        kv_tokens = 0 if seq.prefill_tokens else seq.num_prompt_tokens + seq.produced
        return SimRequestState(
            request=seq.request,
            produced=seq.produced,
            version_runs=tuple((version, count) for version, count in seq.new_versions),
            target=seq.target,
            version=self.version,
            kv_tokens=kv_tokens,
            kv_bytes=kv_tokens * self.config.kv_bytes_per_token,
        )

    # ---- ending requests ----------------------------------------------------------------------------

    def _end_reason(self, seq: _SimRequest) -> FinishReason:
        return FinishReason.LENGTH if seq.target >= self._max_output(seq.request) else FinishReason.STOP

    def _finish(self, seq: _SimRequest, reason: FinishReason) -> Generation:
        self._release(seq)
        if reason is FinishReason.ABORT:
            self.counts["aborted"] += 1
        return self._resolve(seq, reason)

    def _release(self, seq: _SimRequest) -> None:
        """A running ``seq`` leaves the batch: its output settled, its slot and reservation freed."""
        if seq in self.running:
            self._kv_base -= seq.num_prompt_tokens + seq.produced - seq.since_step
            self._settle(seq)
            self.running.remove(seq)
            self.kv_reserved -= seq.reservation

    def _resolve(self, seq: _SimRequest, reason: FinishReason) -> Generation:
        """``seq``'s output so far, also handed to its ``generate`` caller (unless it went away)."""
        generation = self._generation(seq, reason)
        if not seq.result.done():
            seq.result.set_result(generation)
        return generation

    def _generation(self, seq: _SimRequest, reason: FinishReason) -> Generation:
        """The request's output so far; the new tokens as ``RleSequence`` (see ``asyncrl.rle``: O(1) per
        request however long the response, where lists would cost the simulator most of its time)."""
        request = seq.request
        num_new = seq.produced - len(request.prefix_token_ids)
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.prefix_token_ids + RleSequence.repeat(TOKEN_ID, num_new),
            logprobs=request.prefix_logprobs + RleSequence.repeat(TOKEN_LOGPROB, num_new),
            versions=request.prefix_versions + RleSequence.from_runs(seq.new_versions),
            finish_reason=reason,
            text=request.request_id,
        )
