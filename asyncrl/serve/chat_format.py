"""How messages become context text: the tokenizer's chat template (tools included), or the bare contents.

Key decision: the model's sampled turns are never rendered again (the trajectory keeps their tokens), so only
the text *new* messages add is rendered, and it is rendered against a neutral base conversation, not against
the real history: ``render(base + new) - render(base)``. Templates that rewrite earlier turns (Qwen3 drops the
``<think>`` blocks of turns before the last question) would make ``render(history + new)`` disagree with the
tokens the model actually saw; against a base with nothing to rewrite they give exactly the text the template
puts after those turns. The first messages of a conversation are rendered whole (system prompt and tools
included). A template that cannot be diffed even against a base raises ``FormatError`` naming the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from asyncrl.data.base import TaskSample, is_chat_templated
from asyncrl.serve.toolcalls import TOOL_CALL_INSTRUCTIONS, render_tool_call, render_tool_result

Message = dict[str, Any]
"""A chat message as templates read it: ``role``, ``content`` text, and for tool use ``tool_calls`` (each
``{"type": "function", "function": {"name", "arguments": dict}}``), ``tool_call_id``, ``name``."""

MARK = "\u2063ASYNCRL-CONTENT\u2063"
"""Stands in for a sampled turn's content when the text that closes a turn is asked of the template."""
BASES: tuple[tuple[Message, ...], ...] = (
    ({"role": "system", "content": "S"}, {"role": "user", "content": "U"}),
    ({"role": "user", "content": "U"},),
    (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ),
    ({"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}),
)
"""Neutral conversations new messages are diffed against, tried in order (templates that refuse a system
role, or two user messages in a row, take a later one)."""


class FormatError(ValueError):
    """The chat format cannot render this conversation incrementally."""


class ChatFormat(Protocol):
    renders_tools: bool
    """Whether ``context`` renders a request's tools itself (else they are announced in a system message)."""

    def context(self, history: list[Message], new: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The text ``new`` adds after ``history`` (whose assistant turns are closed)."""
        ...

    def generation_prompt(self, history: list[Message]) -> str:
        """The text that opens the model's turn after ``history``."""
        ...

    def close(self, history: list[Message], content: str) -> str:
        """The text that follows a sampled assistant turn ``content`` (after the ``history`` it answered)."""
        ...


def harness_message(message: Message) -> Message:
    """An OpenAI-format message as chat templates read it: content parts joined into text, ``developer`` as
    ``system``, tool-call arguments parsed from JSON text into objects (a template renders them itself)."""
    content = message.get("content") or ""
    if isinstance(content, list):  # the openai "content parts" form: text parts only
        content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
    role = "system" if message["role"] == "developer" else message["role"]
    out: Message = {"role": role, "content": content}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [_call(call, index) for index, call in enumerate(calls)]
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def _call(call: Message, index: int) -> Message:
    function = call["function"]
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except json.JSONDecodeError as err:
        raise ValueError(f"tool_calls[{index}].function.arguments is not JSON: {err}") from err
    return {
        "type": "function",
        "id": call.get("id", ""),
        "function": {"name": function["name"], "arguments": arguments},
    }


def message_text(message: Message) -> str:
    """A message as plain text: its content, tool calls written as ``<tool_call>`` spans, a tool result
    wrapped in ``<tool_response>`` (the ``plain`` format, and what identifies a turn)."""
    content = message["content"] if message["role"] != "tool" else render_tool_result(message["content"])
    for call in message.get("tool_calls") or []:
        content += render_tool_call(call["function"]["name"], call["function"]["arguments"])
    return content


def tools_message(tools: list[dict[str, Any]]) -> Message:
    """The system message that tells the model which tools exist and how to call them (templates without tools)."""
    lines = [json.dumps(tool.get("function", tool), sort_keys=True) for tool in tools]
    return {
        "role": "system",
        "content": TOOL_CALL_INSTRUCTIONS + "\n<tools>\n" + "\n".join(lines) + "\n</tools>",
    }


class TemplateFormat:
    """The tokenizer's chat template, new messages diffed against a neutral base (module docstring)."""

    def __init__(self, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> None:
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError("the tokenizer has no chat template: use serve.chat_format=plain")
        self.tokenizer = tokenizer
        self.renders_tools = "tools" in template
        self.template_kwargs = dict(template_kwargs or {})
        """Extra template variables of every rendering (``task.chat_template_kwargs``)."""

    def _render(self, messages: list[Message], generation_prompt: bool, tools: list | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **self.template_kwargs,
        )

    def context(self, history: list[Message], new: list[Message], tools: list[dict[str, Any]] | None) -> str:
        if not new:
            return ""
        if not self.renders_tools:  # tool calls and results as text (the tools came as a system message)
            new = [{"role": m["role"], "content": message_text(m)} for m in new]
        if not history:  # the conversation's start: rendered whole, its system prompt and tools included
            return self._render(new, False, tools)
        return self._diffed(
            lambda base: (self._render(base, False, tools), self._render(base + new, False, tools))
        )

    def generation_prompt(self, history: list[Message]) -> str:
        return self._diffed(
            lambda base: (self._render(base, False), self._render(base, True)), ending_with_user=True
        )

    def close(self, history: list[Message], content: str) -> str:
        for base in self._bases(ending_with_user=True):
            try:
                whole = self._render([*base, {"role": "assistant", "content": MARK}], False)
            except Exception:  # deliberate: a template that refuses this base may take the next
                continue
            if whole.count(MARK) == 1:
                return whole.split(MARK, 1)[1]
        raise FormatError("the chat template does not render an assistant turn's content as given")

    def _diffed(self, renders: Any, ending_with_user: bool = False) -> str:
        """The first base whose ``(before, after)`` renders extend one another: what ``after`` adds."""
        for base in self._bases(ending_with_user):
            try:
                before, after = renders(list(base))
            except Exception:  # deliberate: templates raise on role orders they refuse; try the next base
                continue
            if after.startswith(before):
                return after[len(before) :]
        raise FormatError(
            "the chat template renders these messages by rewriting the text before them even after a neutral "
            "conversation, so they cannot be appended token-in/token-out; use serve.chat_format=plain"
        )

    @staticmethod
    def _bases(ending_with_user: bool) -> list[tuple[Message, ...]]:
        return [b for b in BASES if not ending_with_user or b[-1]["role"] == "user"]


class PlainFormat:
    """Bare contents, nothing between turns: the format of the built-in environments (a response that stops
    on its own keeps its EOS token, which then separates it from the next observation)."""

    renders_tools = False

    def context(self, history: list[Message], new: list[Message], tools: list[dict[str, Any]] | None) -> str:
        return "".join(message_text(message) for message in new)

    def generation_prompt(self, history: list[Message]) -> str:
        return ""

    def close(self, history: list[Message], content: str) -> str:
        return ""


def make_chat_format(
    name: str, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None
) -> ChatFormat:
    """The format ``serve.chat_format`` names (a template rendered with ``template_kwargs``)."""
    if name == "template":
        return TemplateFormat(tokenizer, template_kwargs)
    if name == "plain":
        return PlainFormat()
    raise ValueError(f"serve.chat_format must be 'template' or 'plain', got {name!r}")


def end_of_turn_ids(tokenizer: Any) -> tuple[int, ...]:
    """The token that closes an assistant turn of ``tokenizer``'s chat template (``<|im_end|>`` for ChatML): a
    response to a prompt rendered with the template stops there. () when the tokenizer has no chat template,
    or its turns close with no special token.

    Why a stop token of its own: an engine stops at the model's EOS ids (its generation config, then its config,
    then the tokenizer), and a base model's EOS is not its template's turn end: Qwen3 Base lists only
    ``<|endoftext|>`` while its template closes turns with ``<|im_end|>``, so a base model that closes its turn
    would otherwise write on past it until ``max_new_tokens``. Every path that samples a templated turn (the
    OpenAI endpoint, agentic turns, RLVR rollouts, evaluation and SFT sampling) takes its stop token from here."""
    if not getattr(tokenizer, "chat_template", None):
        return ()
    history = [{"role": "user", "content": "x"}]
    close = tokenizer.encode(TemplateFormat(tokenizer).close(history, "x"), add_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", []))
    return (close[0],) if close and close[0] in special else ()


class PromptStops:
    """The stop tokens of a task prompt beyond the model's EOS: the chat template's end-of-turn token
    (``end_of_turn_ids``) for a prompt rendered with the template, none for a plain prompt. RLVR rollouts,
    evaluation and the SFT warm start's sampling all ask here, so a templated prompt ends at its turn's end on
    every backend (it lives here, beside ``end_of_turn_ids``, so ``models/sft.py`` reaches it without the
    rollout layer);
    the end-of-turn token is worked out once, at the first templated prompt (a run of plain prompts never asks
    its tokenizer's template anything)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._end_of_turn: tuple[int, ...] | None = None

    def __call__(self, sample: TaskSample) -> tuple[int, ...]:
        if not is_chat_templated(sample, self.tokenizer):
            return ()
        if self._end_of_turn is None:
            self._end_of_turn = end_of_turn_ids(self.tokenizer)
        return self._end_of_turn
