"""The documented tool-call text format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` spans.

Why a text format: the tiny models cannot emit structured tool calls, so a completion carries them as spans
(Hermes/Qwen style) which the server parses into the ``tool_calls`` the ``openai`` client expects; a tool
result message is rendered back into the context as ``<tool_response>...</tool_response>``.
"""

from __future__ import annotations

import json
import re
from typing import Any

_SPAN = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

TOOL_CALL_INSTRUCTIONS = (
    "You may call the tools listed below. To call one, write "
    '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>; its result comes back as '
    "<tool_response>...</tool_response>."
)
"""The system text a request's ``tools`` are announced with (followed by one JSON schema per line)."""


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The span a model (or a scripted solution) writes to call ``name`` with ``arguments``."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, sort_keys=True) + "</tool_call>"


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a completion into its plain content and its well-formed tool calls (malformed spans stay text)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _SPAN.finditer(text):
        try:
            body = json.loads(match.group(1))
            name, arguments = body["name"], body.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ValueError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError):
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append({"name": name, "arguments": json.dumps(arguments, sort_keys=True)})
    kept.append(text[last:])
    return "".join(kept).strip(), calls


def render_tool_result(content: str) -> str:
    """How a ``tool`` message's content appears in the model's context."""
    return f"<tool_response>{content}</tool_response>"
