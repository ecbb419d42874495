"""How messages become context text: the tokenizer's chat template, or the bare contents (``plain``).

Key decision: only *text differences* are rendered. The context of a new message is the template's rendering
of the whole history with it minus the rendering without it, so the template decides every separator while
the model's sampled turns are never rendered again (the server keeps their tokens). A template whose
rendering of a prefix is not a prefix of the rendering of the whole (it rewrites earlier turns) cannot be
extended this way: ``FormatError`` names the fix (``serve.chat_format=plain`` or another template).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from asyncrl.serve.toolcalls import TOOL_CALL_INSTRUCTIONS, render_tool_call, render_tool_result

Message = dict[str, Any]
"""A chat message as the server stores it: ``role`` and ``content`` text (tool calls rendered in)."""


class FormatError(ValueError):
    """The chat format cannot render this conversation incrementally."""


class ChatFormat(Protocol):
    def context(self, history: list[Message], new: list[Message]) -> str:
        """The text ``new`` adds after ``history`` (whose assistant turns are closed)."""
        ...

    def generation_prompt(self, history: list[Message]) -> str:
        """The text that opens the model's turn after ``history``."""
        ...

    def close(self, history: list[Message], content: str) -> str:
        """The text that follows a sampled assistant turn ``content`` (after the ``history`` it answered)."""
        ...


def stored_message(message: Message) -> Message:
    """A harness message as rendered: tool calls written as ``<tool_call>`` spans, tool results wrapped."""
    role = message["role"]
    content = message.get("content") or ""
    if isinstance(content, list):  # the openai "content parts" form: text parts only
        content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
    if role == "tool":
        content = render_tool_result(content)
    for call in message.get("tool_calls") or []:
        function = call["function"]
        content += render_tool_call(function["name"], json.loads(function.get("arguments") or "{}"))
    return {"role": role, "content": content}


def tools_message(tools: list[dict[str, Any]]) -> Message:
    """The system message that tells the model which tools exist and how to call them."""
    lines = [json.dumps(tool.get("function", tool), sort_keys=True) for tool in tools]
    return {
        "role": "system",
        "content": TOOL_CALL_INSTRUCTIONS + "\n<tools>\n" + "\n".join(lines) + "\n</tools>",
    }


class TemplateFormat:
    """The tokenizer's chat template, extended by text differences."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template: use serve.chat_format=plain")
        self.tokenizer = tokenizer

    def _render(self, messages: list[Message], generation_prompt: bool) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _suffix(self, whole: str, prefix: str, what: str) -> str:
        if not whole.startswith(prefix):
            raise FormatError(
                f"the chat template renders {what} by rewriting earlier text, so the conversation cannot be "
                "extended token-in/token-out; use serve.chat_format=plain or a prefix-stable template"
            )
        return whole[len(prefix) :]

    def context(self, history: list[Message], new: list[Message]) -> str:
        return self._suffix(self._render(history + new, False), self._render(history, False), "new messages")

    def generation_prompt(self, history: list[Message]) -> str:
        return self._suffix(
            self._render(history, True), self._render(history, False), "the generation prompt"
        )

    def close(self, history: list[Message], content: str) -> str:
        opened = self._render(history, True) + content
        whole = self._render(history + [{"role": "assistant", "content": content}], False)
        return self._suffix(whole, opened, "an assistant turn")


class PlainFormat:
    """Bare contents, nothing between turns: the format of the built-in environments (a response that stops
    on its own keeps its EOS token, which then separates it from the next observation)."""

    def context(self, history: list[Message], new: list[Message]) -> str:
        return "".join(message["content"] for message in new)

    def generation_prompt(self, history: list[Message]) -> str:
        return ""

    def close(self, history: list[Message], content: str) -> str:
        return ""


def make_chat_format(name: str, tokenizer: Any) -> ChatFormat:
    """The format ``serve.chat_format`` names."""
    if name == "template":
        return TemplateFormat(tokenizer)
    if name == "plain":
        return PlainFormat()
    raise ValueError(f"serve.chat_format must be 'template' or 'plain', got {name!r}")
