"""The JSON bodies of OpenAI responses, built from a service ``CallResult``: the shapes the ``openai`` client
parses, plus asyncrl's own ``asyncrl`` field (the client keeps unknown fields)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from asyncrl.serve.service import CallResult, Choice


def tool_calls(choice: Choice, index: int) -> list[dict[str, Any]]:
    """The answer's parsed tool calls with fresh ids, as ``message.tool_calls`` carries them."""
    return [
        {"id": f"call_{index}_{i}_{uuid.uuid4().hex[:8]}", "type": "function", "function": call}
        for i, call in enumerate(choice.tool_calls)
    ]


def message_content(choice: Choice) -> str | None:
    """The message's ``content``: always a string (``""`` for an empty answer, which clients call ``.strip()``
    on); None only beside tool calls with no text around them, as OpenAI answers."""
    return None if choice.tool_calls and not choice.text else choice.text


def usage(result: CallResult) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in result.choices)
    return {
        "prompt_tokens": result.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.num_prompt_tokens + completion,
    }


def _extra(result: CallResult) -> dict[str, Any]:
    """asyncrl's own fields: where the call landed, and the policy version of every sampled token."""
    return {
        "trajectory_id": result.trajectory_id,
        "branch": result.branch,
        "versions": [c.versions for c in result.choices],
    }


def chat_response(result: CallResult, model: str, logprobs: bool, tokenizer: Any) -> dict[str, Any]:
    choices = []
    for index, choice in enumerate(result.choices):
        message: dict[str, Any] = {"role": "assistant", "content": message_content(choice)}
        if choice.tool_calls:
            message["tool_calls"] = tool_calls(choice, index)
        choices.append(
            {
                "index": index,
                "message": message,
                "finish_reason": choice.finish_reason,
                "logprobs": {
                    "content": [
                        _token_logprob(tokenizer, t, lp)
                        for t, lp in zip(choice.token_ids, choice.logprobs, strict=True)
                    ]
                }
                if logprobs
                else None,
            }
        )
    return _body("chatcmpl", "chat.completion", model, choices, result)


def _token_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def completion_response(result: CallResult, model: str) -> dict[str, Any]:
    choices = [
        {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
        for i, c in enumerate(result.choices)
    ]
    return _body("cmpl", "text_completion", model, choices, result)


def _body(
    id_prefix: str, kind: str, model: str, choices: list[dict[str, Any]], result: CallResult
) -> dict[str, Any]:
    """What both response kinds wrap their choices in: a fresh id, the object kind, usage and asyncrl's fields."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(result),
        "asyncrl": _extra(result),
    }
