"""A scripted fake engine on (virtual) loop time, for proxy, producer and controller tests: able to fail.

A ``FakeEngine`` emits one token per ``step_s`` seconds of (virtual) loop time while not paused. Token ids,
log-probs and lengths are pure functions of the request id and position, so an interrupted-and-continued
request must come out identical to an uninterrupted one; each token carries the engine's version when it
was made. Like the real engine, a continued request's ``max_new_tokens`` counts its prefix and its
Generation starts with the prefix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.engine.migration import RequestState
from asyncrl.types import FinishReason, Generation, Request, SamplingParams


class EngineDied(RuntimeError):
    """What a dead worker raises (stands in for Ray's ActorDiedError)."""


def token_at(request_id: str, position: int) -> int:
    return (zlib.crc32(request_id.encode()) + 7 * position) % 1000


def logprob_at(request_id: str, position: int) -> float:
    return -((zlib.crc32(request_id.encode()) % 97) + position) / 64.0


def make_request(request_id: str, *, max_new_tokens: int = 16, **kwargs: Any) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingParams(max_new_tokens=max_new_tokens),
        **kwargs,
    )


@dataclass
class _Running:
    request: Request
    result: asyncio.Future[Generation]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    producer: asyncio.Task[None] | None = None


class FakeEngine:
    """Scripted engine: see the module docstring; every knob is a keyword argument.

    ``lengths``: total output tokens of a request (prefix included) by request id, or a function of it;
    ``abort_on_pause``: pause() aborts every running request (an engine that cannot keep requests across an
    update); ``fail_after``: request id → tokens produced before this engine dies on it (raises EngineDied);
    ``fail_always``: every generate raises at once; ``hang``: generate never returns;
    ``hang_control``: abort/pause/update never return; ``fail_control``: names of control calls that raise.
    """

    def __init__(
        self,
        *,
        lengths: Mapping[str, int] | Callable[[str], int] | int = 4,
        step_s: float = 1.0,
        version: int = 0,
        abort_on_pause: bool = False,
        fail_after: Mapping[str, int] | None = None,
        fail_always: bool = False,
        hang: bool = False,
        hang_control: bool = False,
        fail_control: frozenset[str] = frozenset(),
        update_s: float = 0.0,
    ) -> None:
        self._lengths = lengths
        self.step_s = step_s
        self.version = version
        self.abort_on_pause = abort_on_pause
        self.fail_after = dict(fail_after or {})
        self.fail_always = fail_always
        self.hang = hang
        self.hang_control = hang_control
        self.fail_control = fail_control
        self.update_s = update_s
        self.paused = False
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self.running: dict[str, _Running] = {}
        self.received: list[Request] = []
        self.updates: list[tuple[int, dict[str, Any]]] = []
        self.running_at_update: list[int] = []
        self.calls: list[str] = []
        self.exported: list[str] = []
        self.imported: list[str] = []

    def length_of(self, request_id: str) -> int:
        if isinstance(self._lengths, int):
            return self._lengths
        if callable(self._lengths):
            return self._lengths(request_id)
        return self._lengths[request_id]

    async def generate(self, request: Request) -> Generation:
        self.received.append(request)
        if self.fail_always:
            raise EngineDied("worker died")
        if self.hang:
            await asyncio.Future()
        assert request.request_id not in self.running, f"duplicate request {request.request_id}"
        run = _Running(
            request=request,
            result=asyncio.get_running_loop().create_future(),
            token_ids=list(request.prefix_token_ids),
            logprobs=list(request.prefix_logprobs),
            versions=list(request.prefix_versions),
        )
        self.running[request.request_id] = run
        run.producer = asyncio.ensure_future(self._produce(run))
        return await asyncio.shield(run.result)

    async def _produce(self, run: _Running) -> None:
        request = run.request
        limit = request.sampling.max_new_tokens
        target = min(self.length_of(request.request_id), limit)
        produced = 0
        while len(run.token_ids) < target:
            await self._unpaused.wait()
            await asyncio.sleep(self.step_s)
            if self.paused:
                continue
            if self.fail_after.get(request.request_id) == produced:
                self._fail(run, EngineDied(f"worker died while serving {request.request_id}"))
                return
            position = len(run.token_ids)
            run.token_ids.append(token_at(request.request_id, position))
            run.logprobs.append(logprob_at(request.request_id, position))
            run.versions.append(self.version)
            produced += 1
        self._finish(run, FinishReason.LENGTH if target == limit else FinishReason.STOP)

    def _finish(self, run: _Running, reason: FinishReason) -> Generation:
        del self.running[run.request.request_id]
        if run.producer is not None and run.producer is not asyncio.current_task():
            run.producer.cancel()
        generation = Generation(
            request_id=run.request.request_id,
            prompt_token_ids=list(run.request.prompt_token_ids),
            token_ids=list(run.token_ids),
            logprobs=list(run.logprobs),
            versions=list(run.versions),
            finish_reason=reason,
        )
        run.result.set_result(generation)
        return generation

    def _fail(self, run: _Running, error: BaseException) -> None:
        del self.running[run.request.request_id]
        run.result.set_exception(error)

    async def _control(self, name: str) -> None:
        self.calls.append(name)
        if self.hang_control:
            await asyncio.Future()
        if name in self.fail_control:
            raise EngineDied(f"{name} failed")

    async def abort(self, request_id: str) -> Generation | None:
        await self._control("abort")
        run = self.running.get(request_id)
        return None if run is None else self._finish(run, FinishReason.ABORT)

    async def export_request(self, request_id: str) -> RequestState | None:
        """Take a running request out (its ``generate`` returns the partial output, aborted); no KV is modelled."""
        await self._control("export_request")
        run = self.running.get(request_id)
        if run is None:
            return None
        partial = self._finish(run, FinishReason.ABORT)
        self.exported.append(request_id)
        return RequestState(
            request=run.request,
            token_ids=list(run.request.prompt_token_ids) + partial.token_ids,
            output_logprobs=partial.logprobs,
            output_versions=partial.versions,
            version=self.version,
        )

    async def import_request(self, state: RequestState) -> Generation:
        """Continue an exported request from its output so far; only at the version it was exported from."""
        if state.version != self.version:
            raise ValueError(
                f"request {state.request_id}: exported at v{state.version}, engine at v{self.version}"
            )
        self.imported.append(state.request_id)
        prefix = {
            "prefix_token_ids": state.output_token_ids,
            "prefix_logprobs": list(state.output_logprobs),
            "prefix_versions": list(state.output_versions),
        }
        return await self.generate(dataclasses.replace(state.request, **prefix))

    async def pause(self) -> None:
        await self._control("pause")
        self.paused = True
        self._unpaused.clear()
        if self.abort_on_pause:
            for run in list(self.running.values()):
                self._finish(run, FinishReason.ABORT)

    async def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        await self._control("update_weights")
        self.running_at_update.append(len(self.running))
        if self.update_s:
            await asyncio.sleep(self.update_s)
        self.updates.append((version, dict(named_tensors)))
        self.version = version

    async def resume(self) -> None:
        await self._control("resume")
        self.paused = False
        self._unpaused.set()


def expected_tokens(request_id: str, count: int) -> tuple[list[int], list[float]]:
    """Tokens and log-probs an uninterrupted request with this id produces in ``count`` steps."""
    return [token_at(request_id, i) for i in range(count)], [logprob_at(request_id, i) for i in range(count)]
