"""Server-sent events of a streaming call: text pieces as the engine samples them, keep-alives while it waits,
then the close built from the call's result.

Key decision: the pieces always add up to the content of the same call unstreamed; a close that cannot (an answer
generated again after an engine failure that differs from what was sent) ends the stream with an error event.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from asyncrl.serve.responses import tool_calls, usage
from asyncrl.serve.schemas import ServeError
from asyncrl.serve.service import CallResult, TextObserver

KEEPALIVE_S = 5.0
"""A streaming call waiting on the engine (e.g. held through a weight update) sends an SSE comment this often."""


class Chunks:
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
            for i, call in enumerate(tool_calls(choice, index)):
                out.append(self._chunk(index, None, tool_calls=[{"index": i, **call}]))
            out.append(self._chunk(index, None, choice.finish_reason))
        if self.include_usage:
            out.append({**self._chunk(0, None), "choices": [], "usage": usage(result)})
        return out


async def stream(
    start: Callable[[TextObserver], Awaitable[CallResult]], chunks: Chunks, num_choices: int
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
