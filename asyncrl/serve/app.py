"""The ASGI application: the routes (``openai_routes``, ``trajectory_routes``), auth, body limit and JSON errors.

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

import logging
import math
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from asyncrl.config.serve import ServeConfig
from asyncrl.serve.openai_routes import Identify, openai_router
from asyncrl.serve.schemas import ServeError
from asyncrl.serve.service import CompletionService
from asyncrl.serve.trajectory_routes import trajectory_router

logger = logging.getLogger(__name__)

TRAJECTORY_PREFIXES = ("", "/trajectories/{trajectory_id}", "/groups/{group_id}/trajectories/{trajectory_id}")


def make_app(service: CompletionService) -> FastAPI:
    """The app serving ``service``; ``service.config`` holds the API key and every bound."""
    app = FastAPI(title="asyncrl OpenAI-compatible endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, max_body_bytes=service.config.max_body_bytes)
    app.add_middleware(CallLimit, config=service.config, calls=service.calls)
    _add_error_handlers(app, service.config)
    identify = identifier(service.config)
    openai_routes = openai_router(service, identify)
    for prefix in TRAJECTORY_PREFIXES:
        app.include_router(openai_routes, prefix=prefix)
    app.include_router(trajectory_router(service, identify))
    return app


def identifier(config: ServeConfig) -> Identify:
    """The check every route runs first: the API key, then the trajectory the call names."""

    def identify(request: Request) -> tuple[str | None, str | None]:
        """The trajectory comes from the path, else from the key's ``<key>#<trajectory>`` form."""
        header = request.headers.get("authorization", "")
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else ""
        secret, _, from_key = token.partition("#")
        if config.api_key and not secrets.compare_digest(secret.encode(), config.api_key.encode()):
            raise ServeError(
                401, "invalid or missing API key (Authorization: Bearer <key>)", None, "authentication_error"
            )
        trajectory_id = request.path_params.get("trajectory_id") or from_key or None
        return trajectory_id, request.path_params.get("group_id")

    return identify


# ---- errors and limits ------------------------------------------------------------------------------------


def retry_after(config: ServeConfig) -> dict[str, str]:
    """The ``Retry-After`` header of a 429 or 503: whole seconds, at least 1."""
    return {"Retry-After": str(max(1, math.ceil(config.retry_after_s)))}


def _add_error_handlers(app: FastAPI, config: ServeConfig) -> None:
    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError) -> JSONResponse:
        headers = retry_after(config) if error.status in (429, 503) else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

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


class CallLimit:
    """ASGI middleware: at most ``serve.max_concurrent_calls`` chat/completion calls served at once (each
    counted until its response, streamed or not, has been sent, except while it waits for its trajectory's
    admission: ``calls["admitting"]``, bounded by the service); one more is answered 429 with
    ``Retry-After`` before its body is read. A call therefore never waits behind an unbounded queue: the
    caller backs off, and the server recovers the moment load drops. A call admitted after waiting is served
    even if the others fill the bound meanwhile: the calls in the app stay within twice the bound."""

    def __init__(self, app: Any, config: ServeConfig, calls: dict[str, int]) -> None:
        """``calls``: the service's counters (``in_flight``, ``admitting``, ``refused``), which ``/health``
        reports."""
        self.app = app
        self.config = config
        self.calls = calls

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(GENERATING_ROUTES):
            await self.app(scope, receive, send)
            return
        if self.calls["in_flight"] - self.calls["admitting"] >= self.config.max_concurrent_calls:
            self.calls["refused"] += 1
            await self._refuse(send)
            return
        self.calls["in_flight"] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.calls["in_flight"] -= 1

    async def _refuse(self, send: Any) -> None:
        limit = self.config.max_concurrent_calls
        error = ServeError(
            429,
            f"the server is serving serve.max_concurrent_calls={limit} calls; retry after the Retry-After delay",
            None,
            "rate_limit_error",
        )
        response = JSONResponse(error.body(), status_code=429, headers=retry_after(self.config))
        await send({"type": "http.response.start", "status": 429, "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})


GENERATING_ROUTES = ("/v1/chat/completions", "/v1/completions")
"""The routes that hold an engine slot; the rest (models, finish, health) are never refused for load."""


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
