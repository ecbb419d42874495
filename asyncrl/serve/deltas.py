"""Streaming text from an engine's output-so-far: only what the final answer is sure to start with.

Key decision: a streaming client must receive exactly the text the non-streamed answer would hold, in pieces,
so each piece is cut from the decode of *all* tokens so far (never decoded alone: a token may end half a UTF-8
character or change how its neighbour decodes) and held back while it may still change: an incomplete
character, trailing whitespace a chat answer strips, and in chat anything from a ``<tool_call>`` opening on
(tool calls are rendered from the final answer), or with Llama 3's JSON calls an answer that may still turn
out to be one (it starts with ``{``). The route sends the rest when the answer is final.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
PYTHON_TAG = "<|python_tag|>"


class TextDeltas:
    """A token observer (``asyncrl.proxy.worker.TokenObserver``) that calls ``emit`` with each new piece."""

    def __init__(
        self, tokenizer: Any, emit: Callable[[str], None], *, chat: bool, json_calls: bool = False
    ) -> None:
        """``json_calls``: tool calls come as a whole-answer JSON object (Llama 3), not ``<tool_call>`` spans."""
        self.tokenizer = tokenizer
        self.emit = emit
        self.chat = chat
        self.json_calls = json_calls
        self.sent = ""

    def __call__(self, token_ids: Sequence[int]) -> None:
        text = self.stable_prefix(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))
        if len(text) > len(self.sent) and text.startswith(self.sent):  # a re-run that diverged sends nothing
            self.emit(text[len(self.sent) :])
            self.sent = text

    def stable_prefix(self, text: str) -> str:
        """The part of ``text`` the final answer's text starts with, whatever tokens come next."""
        text = text.rstrip("\ufffd")
        if not self.chat:
            return text
        if self.json_calls and _may_be_json_call(text):
            return ""
        opening = text.find(TOOL_CALL_OPEN)
        end = opening if opening >= 0 else len(text) - partial_suffix(text, TOOL_CALL_OPEN)
        return text[:end].strip()


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def _may_be_json_call(text: str) -> bool:
    """Whether an answer starting with ``text`` may still be a whole-answer JSON tool call."""
    start = text.lstrip()
    return start.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(start)
