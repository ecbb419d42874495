"""The task seam: a verifiable prompt (``TaskSample``) and a ``Task`` that serves its train and eval splits.

Key decision: a sample carries everything a reward needs (reference answer, how to cut the final answer out
of a response, an optional format pattern), so reward functions are pure ``(response_text, sample)``
functions that can run in any thread or process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from asyncrl.rle import kept

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")


@dataclass(frozen=True, kw_only=True)
class TaskSample:
    """One verifiable prompt.

    ``prompt`` is plain text fed to the model as is; ``messages`` (chat rows) is rendered with the
    tokenizer's chat template when it has one (see ``render_prompt``). ``demonstration`` is a correct
    response (used by SFT); ``answer`` is the reference final answer that rewards compare against.
    """

    uid: str
    """Stable identifier, unique within the task (resume and logging key on it)."""
    prompt: str
    """Plain-text prompt; for chat rows, the content of the last user message."""
    answer: str
    """Reference final answer."""
    messages: tuple[Mapping[str, str], ...] | None = None
    """Chat messages ({role, content}) for chat-style rows; None for plain prompts."""
    demonstration: str | None = None
    """A correct full response, for supervised warm start; None when the data has none."""
    answer_delimiter: str | None = None
    """The final answer is the text after the last occurrence of this marker; None: the whole response."""
    format_regex: str | None = None
    """Regular expression a well-formed response matches in full (the ``format`` reward); None: any."""
    reward: str = "exact_match"
    """Name of the reward that verifies this sample by default."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Task-specific facts (number of items, source dataset entry, ...)."""
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra variables of the chat template when ``messages`` is rendered (``task.chat_template_kwargs``, e.g.
    ``enable_thinking: false`` for Qwen3)."""


class Task(Protocol):
    """A named source of verifiable prompts with disjoint, deterministic train and eval splits."""

    name: str

    def split(self, split: Split) -> Sequence[TaskSample]:
        """The samples of ``split`` ("train" or "eval"), in a fixed order."""
        ...


def check_split(split: str) -> Split:
    """``split`` itself if it is a known split name, else a ValueError listing the allowed ones."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS))}, got {split!r}")
    return split  # type: ignore[return-value]


def is_chat_templated(sample: TaskSample, tokenizer: Any | None) -> bool:
    """Whether ``sample`` reaches the model through ``tokenizer``'s chat template (a chat row, and a tokenizer
    with a template), so its response is a chat turn that ends at the template's end-of-turn token."""
    return sample.messages is not None and bool(getattr(tokenizer, "chat_template", None))


def render_prompt(sample: TaskSample, tokenizer: Any | None = None) -> str:
    """The text the model is prompted with.

    Chat rows go through ``tokenizer.apply_chat_template`` (with the generation prompt) when the tokenizer
    has a chat template; otherwise, and for plain rows, the plain ``prompt`` is used.
    """
    if not is_chat_templated(sample, tokenizer):
        return sample.prompt
    messages = [dict(m) for m in sample.messages]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **sample.chat_template_kwargs
    )


def prompt_token_ids(sample: TaskSample, tokenizer: Any) -> list[int]:
    """The token ids the model is prompted with: what ``apply_chat_template`` gives for chat rows (when the
    tokenizer has a template), ``tokenizer.encode(prompt)`` otherwise.

    Why not ``encode(render_prompt(...))``: templates usually write their own BOS and special tokens as text,
    and encoding that text adds the tokenizer's special tokens a second time (a doubled BOS for Llama-style
    tokenizers), so the model would see a prompt it was never trained on.
    """
    if not is_chat_templated(sample, tokenizer):
        return kept(tokenizer.encode(sample.prompt))  # a simulated prompt stays one run
    messages = [dict(m) for m in sample.messages]
    ids = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
        **sample.chat_template_kwargs,
    )
    return list(ids)


def extract_answer(response_text: str, sample: TaskSample) -> str:
    """The final answer of a response: the text after the sample's delimiter (if any), whitespace-normalised."""
    text = response_text
    if sample.answer_delimiter:
        head, sep, tail = text.rpartition(sample.answer_delimiter)
        text = tail if sep else ""
    return normalize_answer(text)


def normalize_answer(text: str) -> str:
    """Collapse runs of whitespace to one space and strip both ends, so spacing never decides a reward."""
    return " ".join(text.split())


def held_out(key: str, *, seed: int, fraction: float) -> bool:
    """Whether ``key`` (a prompt) belongs to the held-out share ``fraction``, by a stable salted hash.

    The same key always lands on the same side for a given seed, in any process (unlike ``hash()``).
    """
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction
