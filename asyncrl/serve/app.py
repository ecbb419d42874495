"""The ASGI application: OpenAI routes, trajectory routes, auth, body limit and JSON errors.

Routes (each /v1 route also under ``/trajectories/{trajectory_id}`` and
``/groups/{group_id}/trajectories/{trajectory_id}``, which name the trajectory a call extends)::

    GET  /v1/models                     the one served model
    POST /v1/chat/completions           chat (tools, streaming SSE or not)
    POST /v1/completions                raw-text completion
    POST /trajectories/{id}/finish      {"reward": float | null}: end the episode (null: serve.reward_fn scores)
    POST /trajectories/{id}/abort       {"reason": str}: give it up (exported, never trained)
    GET  /trajectories/{id}             its branches: token ids, masks, log-probs, versions
    GET  /health                        counts

Every refusal is a 4xx whose body is ``{"error": {"message", "type", "param", "code"}}`` (the shape the
``openai`` client parses); an unexpected failure is a 500 with the same shape, and the server keeps running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from asyncrl.serve.schemas import ChatRequest, CompletionRequest, ServeError, check_bounds
from asyncrl.serve.service import CallResult, Choice, CompletionService

logger = logging.getLogger(__name__)

KEEPALIVE_S = 5.0
"""A streaming call waiting on the engine (e.g. held through a weight update) sends an SSE comment this often."""

TRAJECTORY_PREFIXES = ("", "/trajectories/{trajectory_id}", "/groups/{group_id}/trajectories/{trajectory_id}")


class FinishBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float | None = Field(default=None, allow_inf_nan=False)


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=1024)


def make_app(service: CompletionService) -> FastAPI:
    """The app serving ``service``; ``service.config`` holds the API key and every bound."""
    config = service.config
    app = FastAPI(title="asyncrl OpenAI-compatible endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_body_bytes=config.max_body_bytes)
    _add_error_handlers(app)

    def identify(request: Request) -> tuple[str | None, str | None]:
        """Check the API key; the trajectory comes from the path, else from ``<key>#<trajectory>``."""
        header = request.headers.get("authorization", "")
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
        secret, _, from_key = token.partition("#")
        if config.api_key and not secrets.compare_digest(secret.encode(), config.api_key.encode()):
            raise ServeError(
                401, "invalid or missing API key (Authorization: Bearer <key>)", None, "authentication_error"
            )
        trajectory_id = request.path_params.get("trajectory_id") or from_key or None
        return trajectory_id, request.path_params.get("group_id")

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
        call = service.chat(body, trajectory_id, group_id)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await _stream(
                call,
                lambda result, created, cid: _chat_chunks(
                    result, created, cid, config.model_name, include_usage
                ),
            )
        result = await call
        return _chat_response(result, config.model_name, body.logprobs, service.tokenizer)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        trajectory_id, group_id = identify(request)
        check_bounds(body, config, tracked=trajectory_id is not None)
        call = service.complete(body, trajectory_id, group_id)
        if body.stream:
            return await _stream(
                call, lambda result, created, cid: _completion_chunks(result, created, cid, config.model_name)
            )
        return _completion_response(await call, config.model_name)

    for prefix in TRAJECTORY_PREFIXES:
        app.include_router(router, prefix=prefix)

    @app.post("/trajectories/{trajectory_id}/finish")
    async def finish(trajectory_id: str, body: FinishBody, request: Request) -> dict[str, Any]:
        identify(request)
        trajectory = await service.finish(trajectory_id, body.reward)
        return {"trajectory_id": trajectory_id, "state": trajectory.state.value, "reward": trajectory.reward}

    @app.post("/trajectories/{trajectory_id}/abort")
    async def abort(trajectory_id: str, body: AbortBody, request: Request) -> dict[str, Any]:
        identify(request)
        trajectory = await service.abort(trajectory_id, body.reason)
        return {"trajectory_id": trajectory_id, "state": trajectory.state.value}

    @app.get("/trajectories/{trajectory_id}")
    async def show(trajectory_id: str, request: Request) -> dict[str, Any]:
        identify(request)
        return {"branches": service.store.get(trajectory_id).export()}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "trajectories": service.store.counts}

    return app


# ---- responses --------------------------------------------------------------------------------------------


def _tool_calls(choice: Choice, index: int) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{index}_{i}_{uuid.uuid4().hex[:8]}", "type": "function", "function": call}
        for i, call in enumerate(choice.tool_calls)
    ]


def _usage(result: CallResult) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in result.choices)
    return {
        "prompt_tokens": result.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.num_prompt_tokens + completion,
    }


def _extra(result: CallResult) -> dict[str, Any]:
    """asyncrl's own fields (the openai client keeps unknown fields): where the call landed, and versions."""
    return {
        "trajectory_id": result.trajectory_id,
        "branch": result.branch,
        "versions": [c.versions for c in result.choices],
    }


def _chat_response(result: CallResult, model: str, logprobs: bool, tokenizer: Any) -> dict[str, Any]:
    choices = []
    for index, choice in enumerate(result.choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.text or None}
        if choice.tool_calls:
            message["tool_calls"] = _tool_calls(choice, index)
        choices.append(
            {
                "index": index,
                "message": message,
                "finish_reason": choice.finish_reason,
                "logprobs": {
                    "content": [
                        _token_logprob(tokenizer, t, lp)
                        for t, lp in zip(choice.token_ids, choice.logprobs, strict=True)
                    ]
                }
                if logprobs
                else None,
            }
        )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(result),
        "asyncrl": _extra(result),
    }


def _token_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def _completion_response(result: CallResult, model: str) -> dict[str, Any]:
    choices = [
        {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
        for i, c in enumerate(result.choices)
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(result),
        "asyncrl": _extra(result),
    }


# ---- streaming --------------------------------------------------------------------------------------------


async def _stream(
    call: Awaitable[CallResult], chunks: Callable[[CallResult, int, str], list[dict[str, Any]]]
) -> Any:
    """Server-sent events of ``call``. The built-in engine returns a turn whole, so the chunks follow once
    it is done; until then SSE comments keep the connection alive (a weight update may hold the call)."""
    task = asyncio.ensure_future(call)
    await asyncio.wait({task}, timeout=0.05)
    if task.done() and task.exception() is not None:  # refused before generating: a plain 4xx
        error = task.exception()
        if isinstance(error, ServeError):
            return JSONResponse(error.body(), status_code=error.status)
        raise error

    async def events() -> AsyncIterator[str]:
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=KEEPALIVE_S)
            if not done:
                yield ": keep-alive\n\n"
        error = task.exception()
        if error is not None:
            body = error.body() if isinstance(error, ServeError) else ServeError(500, str(error)).body()
            yield f"data: {json.dumps(body)}\n\n"
            return
        for chunk in chunks(task.result(), int(time.time()), uuid.uuid4().hex):
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _chat_chunks(
    result: CallResult, created: int, cid: str, model: str, include_usage: bool
) -> list[dict[str, Any]]:
    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{cid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    out = []
    for index, choice in enumerate(result.choices):
        out.append(chunk(index, {"role": "assistant", "content": ""}))
        if choice.text:
            out.append(chunk(index, {"content": choice.text}))
        for i, call in enumerate(_tool_calls(choice, index)):
            out.append(chunk(index, {"tool_calls": [{"index": i, **call}]}))
        out.append(chunk(index, {}, choice.finish_reason))
    if include_usage:
        out.append(
            {
                "id": f"chatcmpl-{cid}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(result),
            }
        )
    return out


def _completion_chunks(result: CallResult, created: int, cid: str, model: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"cmpl-{cid}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}],
        }
        for i, c in enumerate(result.choices)
    ]


# ---- errors and limits ------------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = (
            f"{where}: {first.get('msg', 'invalid request')}"
            if where
            else first.get("msg", "invalid request")
        )
        return JSONResponse(ServeError(400, message, where or None).body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            ServeError(error.status_code, str(error.detail), None, kind).body(), status_code=error.status_code
        )

    @app.exception_handler(Exception)
    async def crashed(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s", request.url.path)
        body = ServeError(500, f"internal error: {type(error).__name__}", None, "server_error").body()
        return JSONResponse(body, status_code=500)


class BodyLimit:
    """ASGI middleware: refuse a body over ``max_body_bytes`` with 413 before the route parses it (by its
    Content-Length, or while reading a chunked one)."""

    def __init__(self, app: Any, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            await self._refuse(send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await self._refuse(send)
                return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        error = ServeError(413, f"request body exceeds serve.max_body_bytes={self.max_body_bytes}", None)
        response = JSONResponse(error.body(), status_code=413)
        await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})
