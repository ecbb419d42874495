"""What the endpoint tests share: a server on its own loop thread, an ``openai`` client for it, and a scripted
engine that answers with given texts through the real tokenizer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai

from asyncrl.proxy.llm_proxy import LLMProxy
from asyncrl.serve.server import EndpointServer
from asyncrl.serve.service import CompletionService
from asyncrl.types import FinishReason, Generation, Request


@dataclass
class Served:
    url: str
    address: tuple[str, int]
    service: CompletionService
    proxy: LLMProxy
    engine: Any
    loop: asyncio.AbstractEventLoop

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the server's loop (weight updates, store reads) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)


def serve_in_thread(service: CompletionService, proxy: LLMProxy, engine: Any) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    server = EndpointServer(service)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
    try:
        yield Served(server.url, server.address, service, proxy, engine, loop)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        engine.shutdown()


def client(served: Served, trajectory: str | None = None) -> openai.OpenAI:
    base = served.url + (f"/trajectories/{trajectory}" if trajectory else "") + "/v1"
    return openai.OpenAI(base_url=base, api_key="sekrit", max_retries=0, timeout=30)


class ScriptedEngine:
    """An ``EngineClient`` that answers each request with the next scripted text (real tokenizer)."""

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)

    async def generate(self, request: Request) -> Generation:
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + list(
            request.sampling.stop_token_ids[:1]
        )
        return Generation(
            request_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            versions=[0] * len(ids),
            finish_reason=FinishReason.STOP,
        )

    async def abort(self, request_id: str) -> None:
        return None

    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def update_weights(self, named_tensors: Any, version: int) -> None: ...

    def shutdown(self) -> None: ...
