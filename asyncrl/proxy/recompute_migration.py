"""Migration without the KV cache: a request leaves its donor as the prefix it generated, and its receiver
recomputes that prefix's KV (one prefill of prompt + prefix) before it continues.

Why: ``multi_version`` (DORA) moves in-flight requests off an engine that is switching to the newest weights
onto engines still serving the request's version. The built-in engine exports a request with its KV; vLLM
has no API to hand a sequence's KV blocks to another engine, but every engine the proxy drives can abort a
request and return its prefix, and continue a request after a prefix (the ``EngineClient`` contract). So
this adapter turns any such engine into a ``MigratableEngineClient``: exporting is an abort, importing is a
continuation on the receiver. The tokens, log-probs and versions already generated travel unchanged; what
migration costs is a prefill of the prefix on the receiver instead of a KV copy (``kv_bytes`` is 0, and
``recomputed_tokens`` counts what was prefilled again).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asyncrl.proxy.continuation import check_continued, continuation_request
from asyncrl.proxy.worker import EngineClient, NamedTensors
from asyncrl.types import Generation, Request


@dataclass(frozen=True)
class PrefixState:
    """An exported request: the request that continues it after the prefix its donor generated."""

    request: Request

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def kv_bytes(self) -> int:
        return 0


class RecomputeMigration:
    """``engine`` (any ``EngineClient``) with ``export_request`` / ``import_request`` by prefix recompute."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self._running: dict[str, Request] = {}
        self.recomputed_tokens = 0

    async def generate(self, request: Request) -> Generation:
        with self._tracked(request):
            return await self.engine.generate(request)

    async def abort(self, request_id: str) -> Generation | None:
        return await self.engine.abort(request_id)

    async def export_request(self, request_id: str) -> PrefixState | None:
        """Abort the request here; its ``generate`` returns the partial output with ``finish_reason="abort"``.
        None if it is not running here (it already ended). ``ValueError`` naming the request where the abort's
        output does not start with the prefix the request ran with: its continuation would train on a
        truncated trajectory (the request stays aborted, as its ``generate`` returned)."""
        request = self._running.get(request_id)
        if request is None:
            return None
        partial = await self.engine.abort(request_id)
        if partial is None:
            return None
        check_continued(partial, request)
        return PrefixState(continuation_request(request, partial))

    async def import_request(self, state: PrefixState) -> Generation:
        """Continue an exported request here: its generation starts with the donor's prefix."""
        self.recomputed_tokens += len(state.request.prompt_token_ids) + len(state.request.prefix_token_ids)
        with self._tracked(state.request):
            return await self.engine.generate(state.request)

    async def pause(self) -> None:
        await self.engine.pause()

    async def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        await self.engine.update_weights(named_tensors, version)

    async def resume(self) -> None:
        await self.engine.resume()

    def stats(self) -> dict[str, Any]:
        """The engine's own stats (when it has them) and the prefix tokens prefilled again by migrations."""
        inner = getattr(self.engine, "stats", None)
        return {**(inner() if callable(inner) else {}), "recomputed_tokens": self.recomputed_tokens}

    @contextmanager
    def _tracked(self, request: Request) -> Iterator[None]:
        """Remember what runs here, so an export can build its continuation."""
        self._running[request.request_id] = request
        try:
            yield
        finally:
            if self._running.get(request.request_id) is request:
                del self._running[request.request_id]


def migratable(engine: EngineClient) -> Any:
    """``engine`` itself when it exports requests with their KV, else wrapped to migrate by recompute.

    A client says so with ``exports_kv`` where its methods cannot tell (the Ray client has
    ``export_request`` whichever engine its actor runs); otherwise having ``export_request`` is the answer."""
    exports_kv = getattr(engine, "exports_kv", callable(getattr(engine, "export_request", None)))
    return engine if exports_kv else RecomputeMigration(engine)
