"""A cost-model engine behind the real ``EngineClient`` seam: continuous batching on the loop's (virtual) clock.

Key decision: event-driven, not token-driven. The running batch changes only at step boundaries (a request
joins, finishes, is aborted, or the engine pauses), so the engine plans a *segment* — steps until its first
running request finishes — and sets one timer at its end (``asyncrl.sim.cost``). A change that arrives
mid-segment shortens the segment to the end of the step in progress, as a real engine admits new requests
and applies aborts between steps. A request's life: waiting (FIFO, admitted when a slot and its KV
reservation are free) → running → finished (stop or length) | aborted (partial output returned).

Each token carries the version of the weights that made it, so in-flight updates (``pause`` →
``update_weights`` → ``resume``) produce multi-version generations exactly as the real engine does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.sim import SimEngineConfig
from asyncrl.runs import Runs
from asyncrl.sim import cost
from asyncrl.sim.timeline import Timeline
from asyncrl.types import FinishReason, Generation, Request

TOKEN_ID = 0
TOKEN_LOGPROB = -1.0


@dataclass(eq=False)
class _SimRequest:
    request: Request
    result: asyncio.Future[Generation]
    target: int
    """Output tokens (prefix included) at which the request ends."""
    produced: int
    """Output tokens so far (prefix included)."""
    reservation: int
    new_versions: list[list[int]] = field(default_factory=list)
    """[version, count] runs of the tokens made here (after the prefix)."""
    prefill_tokens: int = 0
    """Context tokens to prefill in the next step (the prompt on admission, everything after a recompute)."""

    @property
    def context(self) -> int:
        return len(self.request.prompt_token_ids) + self.produced


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
        self.length_of = length_of
        self.name = name
        self.timeline = timeline or Timeline(enabled=False)
        self.version = version
        self.paused = False
        self.waiting: deque[_SimRequest] = deque()
        self.running: list[_SimRequest] = []
        self.kv_reserved = 0
        self._segment: _Segment | None = None
        self._busy_since: float | None = None
        self._kick_scheduled = False
        self._pending_aborts: dict[str, asyncio.Future[Generation | None]] = {}
        self._pause_waiters: list[asyncio.Future[None]] = []
        self.counts = {"requests": 0, "tokens": 0, "segments": 0, "aborted": 0, "updates": 0}

    @property
    def generating(self) -> bool:
        """Requests are decoding now (what the trainer's ``concurrent_slowdown`` contends with)."""
        return bool(self.running) and not self.paused

    # ---- EngineClient ----------------------------------------------------------------------------------

    async def generate(self, request: Request) -> Generation:
        loop = asyncio.get_running_loop()
        produced = len(request.prefix_token_ids)
        target = max(produced, min(self.length_of(request.request_id), request.sampling.max_new_tokens))
        reservation = len(request.prompt_token_ids) + request.sampling.max_new_tokens
        if reservation > self.config.max_kv_tokens:
            raise ValueError(
                f"request {request.request_id}: needs {reservation} KV tokens, more than the engine has"
            )
        seq = _SimRequest(request, loop.create_future(), target, produced, reservation)
        self.counts["requests"] += 1
        if produced >= target:
            return self._generation(seq, self._end_reason(seq))
        seq.prefill_tokens = seq.context
        self.waiting.append(seq)
        self._kick()
        return await seq.result  # a cancelled caller cancels only this future: the request runs on, unread

    async def abort(self, request_id: str) -> Generation | None:
        for seq in self.waiting:
            if seq.request.request_id == request_id:
                self.waiting.remove(seq)
                return self._finish(seq, FinishReason.ABORT)
        if not any(seq.request.request_id == request_id for seq in self.running):
            return None
        if self._segment is None:  # paused: no step in progress
            return self._finish(self._running_seq(request_id), FinishReason.ABORT)
        waiter = self._pending_aborts.get(request_id)
        if waiter is None:
            waiter = self._pending_aborts[request_id] = asyncio.get_running_loop().create_future()
            self._shorten()
        return await asyncio.shield(waiter)

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
                seq.prefill_tokens = seq.context

    async def resume(self) -> None:
        self.paused = False
        self._kick()

    def stats(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "running": len(self.running),
            "waiting": len(self.waiting),
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
        for seq in [s for s in self.running if s.produced >= s.target]:
            self._finish(seq, self._end_reason(seq))
        self._apply_aborts()
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
        prefill_s = prefill_tokens * self.config.prefill_s_per_token
        segment_s = cost.segment_s(self.config, len(self.running), num_kv, num_steps, prefill_s)
        timer = loop.call_at(now + segment_s, self._on_boundary)
        self._segment = _Segment(now, len(self.running), num_kv, prefill_s, num_steps, timer)
        self.counts["segments"] += 1

    def _take_batch_totals(self) -> tuple[int, int, int]:
        """Prefill tokens due (cleared: paid in this segment), KV tokens, and steps until the first request
        ends, of the running batch; one pass, as the engine re-plans at every finish."""
        prefill_tokens = num_kv = 0
        num_steps = self.running[0].target - self.running[0].produced
        for seq in self.running:
            prefill_tokens += seq.prefill_tokens
            seq.prefill_tokens = 0
            num_kv += seq.context
            if seq.target - seq.produced < num_steps:
                num_steps = seq.target - seq.produced
        return prefill_tokens, num_kv, num_steps

    def _segment_s(self, segment: _Segment, num_steps: int) -> float:
        return cost.segment_s(
            self.config, segment.num_running, segment.num_kv_tokens, num_steps, segment.prefill_s
        )

    def _advance(self, num_steps: int) -> None:
        """Every running request made ``num_steps`` tokens at the current version."""
        version = self.version
        for seq in self.running:
            runs = seq.new_versions
            if runs and runs[-1][0] == version:
                runs[-1][1] += num_steps
            else:
                runs.append([version, num_steps])
            seq.produced += num_steps
        self.counts["tokens"] += num_steps * len(self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_running_requests:
            head = self.waiting[0]
            if self.kv_reserved + head.reservation > self.config.max_kv_tokens:
                return
            self.waiting.popleft()
            self.kv_reserved += head.reservation
            self.running.append(head)

    def _has_admittable(self) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_running_requests:
            return False
        return self.kv_reserved + self.waiting[0].reservation <= self.config.max_kv_tokens

    def _apply_aborts(self) -> None:
        pending, self._pending_aborts = self._pending_aborts, {}
        for request_id, waiter in pending.items():
            seq = next((s for s in self.running if s.request.request_id == request_id), None)
            waiter.set_result(None if seq is None else self._finish(seq, FinishReason.ABORT))

    def _go_idle(self) -> None:
        if self._busy_since is not None:
            self.timeline.add(self.name, self._busy_since, asyncio.get_running_loop().time(), "generate")
            self._busy_since = None

    # ---- ending requests ----------------------------------------------------------------------------

    def _running_seq(self, request_id: str) -> _SimRequest:
        return next(seq for seq in self.running if seq.request.request_id == request_id)

    def _end_reason(self, seq: _SimRequest) -> FinishReason:
        return FinishReason.LENGTH if seq.target >= seq.request.sampling.max_new_tokens else FinishReason.STOP

    def _finish(self, seq: _SimRequest, reason: FinishReason) -> Generation:
        if seq in self.running:
            self.running.remove(seq)
            self.kv_reserved -= seq.reservation
        if reason is FinishReason.ABORT:
            self.counts["aborted"] += 1
        generation = self._generation(seq, reason)
        if not seq.result.done():
            seq.result.set_result(generation)
        return generation

    def _generation(self, seq: _SimRequest, reason: FinishReason) -> Generation:
        """The request's output so far; the new tokens as ``Runs`` (see ``asyncrl.runs``: O(1) per
        request however long the response, where lists would cost the simulator most of its time)."""
        request = seq.request
        num_new = seq.produced - len(request.prefix_token_ids)
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=request.prefix_token_ids + Runs.repeat(TOKEN_ID, num_new),
            logprobs=request.prefix_logprobs + Runs.repeat(TOKEN_LOGPROB, num_new),
            versions=request.prefix_versions + Runs.from_runs(seq.new_versions),
            finish_reason=reason,
            text=request.request_id,
        )
