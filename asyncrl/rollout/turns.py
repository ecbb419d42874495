"""How an agentic episode's turns become tokens: observations as they are (``plain``), or as chat turns rendered
by the tokenizer's own template (``template``: each observation a user message, each response closed the way
the template closes an assistant turn, then its generation prompt).

Key decision: the same incremental rendering as the OpenAI endpoint (``serve.chat_format``), so the model's
responses stay exactly the tokens it sampled and a template that rewrites earlier turns never changes them;
only what comes after a response is rendered.
"""

from __future__ import annotations

from typing import Any, Protocol

from asyncrl.serve.chat_format import Message, TemplateFormat, end_of_turn_ids
from asyncrl.serve.tito import closing_text


class Turns(Protocol):
    stop_token_ids: tuple[int, ...]
    """Tokens that end a response (the template's end-of-turn marker; none for plain)."""

    def first(self, observation: str, tools: list[dict[str, Any]] | None) -> list[int]:
        """The episode's prompt from its first observation."""
        ...

    def after(
        self, response_ids: list[int], response_text: str, stopped: bool, observation: str
    ) -> list[int]:
        """What follows a response: its close, the next observation and the opening of the next response."""
        ...


class PlainTurns:
    """Observations encoded as they are (the format of the built-in environments)."""

    stop_token_ids: tuple[int, ...] = ()

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def first(self, observation: str, tools: list[dict[str, Any]] | None) -> list[int]:
        return list(self.tokenizer.encode(observation))

    def after(
        self, response_ids: list[int], response_text: str, stopped: bool, observation: str
    ) -> list[int]:
        return list(self.tokenizer.encode(observation))


class TemplateTurns:
    """Observations as user messages of the tokenizer's chat template (tools rendered into the first one)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.format = TemplateFormat(tokenizer)
        self.stop_token_ids = end_of_turn_ids(tokenizer)
        self.history: list[Message] = []

    def first(self, observation: str, tools: list[dict[str, Any]] | None) -> list[int]:
        self.history = [{"role": "user", "content": observation}]
        return self._encode(
            self.format.context([], self.history, tools) + self.format.generation_prompt(self.history)
        )

    def after(
        self, response_ids: list[int], response_text: str, stopped: bool, observation: str
    ) -> list[int]:
        close = closing_text(self.format, self.tokenizer, self.history, response_text, response_ids, stopped)
        self.history.append({"role": "assistant", "content": response_text})
        new: list[Message] = [{"role": "user", "content": observation}]
        text = close + self.format.context(self.history, new, None)
        self.history += new
        return self._encode(text + self.format.generation_prompt(self.history))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def make_turns(name: str, tokenizer: Any) -> Turns:
    """The turn rendering ``env_manager.chat_format`` names, for one episode."""
    if name == "template":
        return TemplateTurns(tokenizer)
    if name == "plain":
        return PlainTurns(tokenizer)
    raise ValueError(f"env_manager.chat_format must be 'plain' or 'template', got {name!r}")
