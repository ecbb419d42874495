"""The OpenAI routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``.

Each route only checks the caller and the request's bounds, then hands the call to the service and renders its
result (a JSON body, or server-sent events when ``stream`` is set); all recording happens in the service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from asyncrl.serve.responses import chat_response, completion_response
from asyncrl.serve.schemas import ChatRequest, CompletionRequest, check_bounds
from asyncrl.serve.service import CompletionService
from asyncrl.serve.streaming import Chunks, stream

Identify = Callable[[Request], tuple[str | None, str | None]]
"""Checks a request's API key and names its ``(trajectory_id, group_id)`` (``ServeError`` 401 if the key is wrong)."""


def openai_router(service: CompletionService, identify: Identify) -> APIRouter:
    """The three routes, relative to ``/v1``'s parent (the app mounts them under every trajectory prefix)."""
    config = service.config
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        identify(request)
        return {
            "object": "list",
            "data": [{"id": config.model_name, "object": "model", "created": 0, "owned_by": "asyncrl"}],
        }

    @router.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        trajectory_id, group_id = identify(request)
        check_bounds(body, config, tracked=trajectory_id is not None)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await stream(
                lambda on_text: service.chat(body, trajectory_id, group_id, on_text),
                Chunks("chat", config.model_name, include_usage),
                body.n,
            )
        result = await service.chat(body, trajectory_id, group_id)
        return chat_response(result, config.model_name, body.logprobs, service.tokenizer)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        trajectory_id, group_id = identify(request)
        check_bounds(body, config, tracked=trajectory_id is not None)
        if body.stream:
            return await stream(
                lambda on_text: service.complete(body, trajectory_id, group_id, on_text),
                Chunks("completion", config.model_name),
                body.n,
            )
        return completion_response(await service.complete(body, trajectory_id, group_id), config.model_name)

    return router
