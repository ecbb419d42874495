"""Request bodies of the OpenAI routes, and the bounds every field is checked against.

Key decision: the models accept the fields the ``openai`` client sends, ignore only those with no effect on
sampling (``user``, ``metadata``, ``store``...), and refuse the rest (``logit_bias``, penalties,
``response_format`` other than text...) with a 400 naming the field, so a harness never silently gets a
different distribution than it asked for. Bounds come from ``ServeConfig`` at run time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from asyncrl.config.serve import ServeConfig


class ServeError(Exception):
    """A request the server refuses: the HTTP status, the message and the offending field (OpenAI error shape)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        """``code``: a machine-readable reason a client may act on (``run_restarted``), else None."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str = Field(max_length=256)
    arguments: str = "{}"


class ToolCall(_Strict):
    id: str = Field(default="", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str = ""


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=256)
    refusal: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(max_length=256)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionSpec


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by chat and completion requests."""

    model: str = ""
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**62)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=0)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    max_completion_tokens: int | None = None
    response_format: dict[str, Literal["text"]] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str
    logprobs: int | None = Field(default=None, ge=0, le=0)
    echo: bool = Field(default=False, le=False)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


def check_bounds(request: ChatRequest | CompletionRequest, config: ServeConfig, *, tracked: bool) -> int:
    """Refuse a request outside ``config``'s bounds (400 naming the field); returns its ``max_tokens``."""
    max_tokens = request.requested_max_tokens()
    if max_tokens is None:
        max_tokens = config.default_max_tokens
    _within("max_tokens", max_tokens, 1, config.max_tokens_limit)
    _within("n", request.n, 1, 1 if tracked else config.max_n)
    _within("stop", len(request.stops()), 0, config.max_stop)
    if request.model and request.model != config.model_name:
        raise ServeError(
            404,
            f"model {request.model!r} is not served here; this server serves {config.model_name!r}",
            "model",
            "not_found_error",
        )
    if isinstance(request, ChatRequest):
        _within("messages", len(request.messages), 1, config.max_messages)
        _within("tools", len(request.tools or []), 0, config.max_tools)
        for index, message in enumerate(request.messages):
            _text_fits(f"messages[{index}].content", message.content, config.max_content_chars)
    else:
        _text_fits("prompt", request.prompt, config.max_content_chars)
    return max_tokens


def _within(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ServeError(400, f"{field} must be in [{low}, {high}] on this server, got {value}", field)


def _text_fits(field: str, content: str | list[ContentPart] | None, limit: int) -> None:
    if content is None:
        return
    size = len(content) if isinstance(content, str) else sum(len(part.text) for part in content)
    if size > limit:
        raise ServeError(400, f"{field} has {size} characters; this server takes at most {limit}", field)
