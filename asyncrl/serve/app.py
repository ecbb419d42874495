"""The ASGI application: OpenAI routes, trajectory routes, auth, body limit and JSON errors.

Routes (each /v1 route also under ``/trajectories/{trajectory_id}`` and
``/groups/{group_id}/trajectories/{trajectory_id}``, which name the trajectory a call extends)::

    GET  /v1/models                     the one served model
    POST /v1/chat/completions           chat (tools, streaming SSE token by token, or not)
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
from asyncrl.serve.service import CallResult, Choice, CompletionService, TextObserver

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
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return await _stream(
                lambda on_text: service.chat(body, trajectory_id, group_id, on_text),
                _Chunks("chat", config.model_name, include_usage),
                body.n,
            )
        result = await service.chat(body, trajectory_id, group_id)
        return _chat_response(result, config.model_name, body.logprobs, service.tokenizer)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        trajectory_id, group_id = identify(request)
        check_bounds(body, config, tracked=trajectory_id is not None)
        if body.stream:
            return await _stream(
                lambda on_text: service.complete(body, trajectory_id, group_id, on_text),
                _Chunks("completion", config.model_name),
                body.n,
            )
        return _completion_response(await service.complete(body, trajectory_id, group_id), config.model_name)

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


class _Chunks:
    """The SSE chunks of one streaming route: pieces of text as they come, then the close from the result."""

    def __init__(self, kind: str, model: str, include_usage: bool = False) -> None:
        self.kind, self.model, self.include_usage = kind, model, include_usage
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _chunk(self, index: int, text: str | None, finish: str | None = None, **delta: Any) -> dict[str, Any]:
        if self.kind == "chat":
            content = {} if text is None else {"content": text}
            choice = {
                "index": index,
                "delta": {**delta, **content},
                "finish_reason": finish,
                "logprobs": None,
            }
            kind = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def opening(self, num_choices: int) -> list[dict[str, Any]]:
        """Chat announces each answer's role first (as OpenAI does); completions start with text."""
        if self.kind != "chat":
            return []
        return [self._chunk(i, "", role="assistant") for i in range(num_choices)]

    def piece(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, text)

    def closing(self, result: CallResult, sent: dict[int, str]) -> list[dict[str, Any]]:
        """Per answer: the text not streamed yet, its tool calls, its finish reason; then the usage if asked.
        ``ServeError`` if what was streamed is not how the final answer starts (a re-run that diverged)."""
        out = []
        for index, choice in enumerate(result.choices):
            streamed = sent.get(index, "")
            if not choice.text.startswith(streamed):
                raise ServeError(
                    503,
                    "the answer was generated again after an engine failure and differs from the text "
                    "already streamed; retry the call",
                    None,
                    "server_error",
                )
            if len(choice.text) > len(streamed):
                out.append(self.piece(index, choice.text[len(streamed) :]))
            for i, call in enumerate(_tool_calls(choice, index)):
                out.append(self._chunk(index, None, tool_calls=[{"index": i, **call}]))
            out.append(self._chunk(index, None, choice.finish_reason))
        if self.include_usage:
            out.append({**self._chunk(0, None), "choices": [], "usage": _usage(result)})
        return out


async def _stream(
    start: Callable[[TextObserver], Awaitable[CallResult]], chunks: _Chunks, num_choices: int
) -> Any:
    """Server-sent events of a call: each piece of text as the engine samples it (engines that cannot report
    progress give the whole answer at the end). While nothing comes, SSE comments keep the connection alive
    (a weight update may hold the call)."""
    pieces: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    task = asyncio.ensure_future(start(lambda index, text: pieces.put_nowait((index, text))))
    await asyncio.wait({task}, timeout=0.05)
    if task.done() and task.exception() is not None:  # refused before generating: a plain 4xx
        error = task.exception()
        if isinstance(error, ServeError):
            return JSONResponse(error.body(), status_code=error.status)
        raise error

    async def events() -> AsyncIterator[str]:
        sent: dict[int, str] = {}
        for chunk in chunks.opening(num_choices):
            yield _event(chunk)
        async for index, text in _pieces_until(task, pieces):
            if text is None:
                yield ": keep-alive\n\n"
                continue
            sent[index] = sent.get(index, "") + text
            yield _event(chunks.piece(index, text))
        try:
            closing = chunks.closing(task.result(), sent)
        except Exception as error:  # deliberate: a failed call ends its stream with an error event
            yield _event((error if isinstance(error, ServeError) else ServeError(500, str(error))).body())
            return
        for chunk in closing:
            yield _event(chunk)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _pieces_until(
    task: asyncio.Future[CallResult], pieces: asyncio.Queue[tuple[int, str]]
) -> AsyncIterator[tuple[int, str | None]]:
    """Every piece queued until ``task`` is done (those queued before it ended included), in order; a
    ``(0, None)`` each ``KEEPALIVE_S`` without one."""
    while True:
        if not pieces.empty():
            yield pieces.get_nowait()
            continue
        if task.done():
            return
        getter = asyncio.ensure_future(pieces.get())
        done, _ = await asyncio.wait({task, getter}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            yield getter.result()
            continue
        getter.cancel()
        if not done:
            yield 0, None


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


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
