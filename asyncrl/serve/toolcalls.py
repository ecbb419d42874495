"""Tool calls in model text, per model family: the Hermes/Qwen ``<tool_call>{json}</tool_call>`` spans and the
Llama 3 JSON form (``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``).

Why text: a model writes its tool calls as text its chat template taught it; the server parses that text into
the ``tool_calls`` the ``openai`` client expects. The Hermes span is also the documented format for templates
that know no tools (the tools are then announced in a system message, ``TOOL_CALL_INSTRUCTIONS``), and the
text form a harness's tool calls and results take in a ``plain`` context.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_SPAN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"
TOOL_PARSERS = ("auto", "hermes", "llama3", "none")

TOOL_CALL_INSTRUCTIONS = (
    "You may call the tools listed below. To call one, write "
    '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>; its result comes back as '
    "<tool_response>...</tool_response>."
)
"""The system text a request's ``tools`` are announced with when the chat template cannot render them."""

ToolParser = Callable[[str], tuple[str, list[dict[str, Any]]]]
"""Model text → (content left, calls as ``{"name": str, "arguments": JSON text}``)."""


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The Hermes span a model (or a scripted solution) writes to call ``name`` with ``arguments``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, sort_keys=True) + "</tool_call>"


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Hermes/Qwen: split a completion into its plain content and its well-formed ``<tool_call>`` spans
    (malformed spans stay text)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _SPAN.finditer(text):
        call = _call_of(match.group(1), "arguments")
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    return "".join(kept).strip(), calls


def parse_llama3_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Llama 3: the whole answer (after an optional ``<|python_tag|>``) is one call ``{"name": ...,
    "parameters": {...}}``, or several separated by ``;``; anything else is plain content."""
    body = text.strip().removeprefix(PYTHON_TAG).strip()
    if not body.startswith("{"):
        return text.strip(), []
    calls = [_call_of(piece, "parameters") for piece in _json_objects(body)]
    if not calls or any(call is None for call in calls):
        return text.strip(), []
    return "", calls  # type: ignore[return-value]


def _json_objects(body: str) -> list[str]:
    """``body`` as consecutive JSON objects separated by ``;`` or whitespace ([] if it is not)."""
    decoder, pieces, position = json.JSONDecoder(), [], 0
    while position < len(body):
        try:
            _, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return []
        pieces.append(body[position:end])
        position = end
        while position < len(body) and body[position] in "; \n\t":
            position += 1
    return pieces


def _call_of(raw: str, arguments_key: str) -> dict[str, Any] | None:
    """``{"name", "arguments"}`` of one JSON call, or None when it is not one (``arguments`` also accepted)."""
    try:
        body = json.loads(raw)
        name = body["name"]
        arguments = body.get(arguments_key, body.get("arguments", {}))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return {"name": name, "arguments": json.dumps(arguments, sort_keys=True)}


def make_tool_parser(name: str, chat_template: str | None) -> ToolParser:
    """The parser ``serve.tool_parser`` names; ``auto`` reads the chat template: Llama 3's ``<|python_tag|>`` /
    ``ipython`` role means Llama 3, anything else Hermes (also the format of the tools system message)."""
    if name == "auto":
        template = chat_template or ""
        name = "llama3" if PYTHON_TAG in template or "ipython" in template else "hermes"
    if name == "hermes":
        return parse_tool_calls
    if name == "llama3":
        return parse_llama3_tool_calls
    if name == "none":
        return lambda text: (text.strip(), [])
    raise ValueError(f"serve.tool_parser must be one of {', '.join(map(repr, TOOL_PARSERS))}, got {name!r}")


def render_tool_result(content: str) -> str:
    """How a ``tool`` message's content appears in a context the chat template does not render."""
    return f"<tool_response>{content}</tool_response>"
