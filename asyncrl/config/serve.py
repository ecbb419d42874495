"""Configuration of the OpenAI-compatible endpoint: where it listens, who may call it, and every bound.

Key decision: every numeric and list field of a request is bounded here, so a harness (or an attacker on the
same host) cannot make one call hold the engine, the memory or the event loop for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CHAT_FORMATS = ("template", "plain")


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """The endpoint (``asyncrl serve`` and ``producer: external`` runs)."""

    host: str = "127.0.0.1"
    """Address to bind. The loopback default keeps the endpoint off the network; anything else is a choice."""
    port: int = 8000
    """TCP port; 0 picks a free one (the bound port is printed and written to ``endpoint.json``). A training run
    that restarts from its checkpoint (``TrainerDied``) binds the port its first attempt bound again."""
    bind_timeout_s: float = 30.0
    """``producer: external``: how long the endpoint retries a port still in use (a restarted run binding its
    first attempt's port again) before failing with ``EndpointPortBusy``. ``asyncrl serve`` does not retry."""
    api_key: str = ""
    """When set, every call must send ``Authorization: Bearer <api_key>`` (optionally ``<api_key>#<trajectory>``
    to name its trajectory); empty accepts any key."""
    model_name: str = "asyncrl-policy"
    """The model id ``/v1/models`` lists and responses carry; requests may name it or leave it out."""
    chat_format: Literal["template", "plain"] = "template"
    """template: messages are rendered with the tokenizer's chat template. plain: each message is its bare
    content (the format of the built-in environments); assistant turns are the model's own tokens either way."""
    tool_parser: Literal["auto", "hermes", "llama3", "none"] = "auto"
    """How tool calls are read from the model's text. hermes: Hermes/Qwen ``<tool_call>{json}</tool_call>``
    spans. llama3: Llama 3's JSON form (``{"name": ..., "parameters": {...}}``, optionally after
    ``<|python_tag|>``). auto: llama3 when the chat template is Llama 3's (``<|python_tag|>`` / ``ipython``),
    else hermes; a template that knows no tools always uses hermes, the format its tools message documents."""
    default_max_tokens: int = 64
    """Tokens generated when a request gives no ``max_tokens``."""
    max_tokens_limit: int = 1024
    """Largest ``max_tokens`` a request may ask for."""
    max_n: int = 4
    """Largest ``n`` (choices per call); calls on a named trajectory must use n = 1."""
    max_messages: int = 256
    """Most messages in one chat request."""
    max_tools: int = 32
    """Most tools in one chat request."""
    max_stop: int = 4
    """Most stop strings in one request."""
    max_content_chars: int = 65536
    """Longest text of one message or prompt, in characters."""
    max_context_tokens: int = 4096
    """A call whose context plus ``max_tokens`` would exceed this is refused (400) before reaching an engine."""
    max_body_bytes: int = 1_048_576
    """Largest request body; larger ones are refused with 413 before they are parsed."""
    max_concurrent_calls: int = 256
    """Chat and completion calls served at once (a streaming one until its last chunk). One more is answered
    at once with 429 and ``Retry-After``, never queued without limit: under overload latency stays bounded
    and the ``openai`` client backs off and retries by itself."""
    retry_after_s: float = 1.0
    """The ``Retry-After`` a 429 (over ``max_concurrent_calls`` or ``max_trajectories``) or a 503 (an engine
    failed the call) carries, in seconds (rounded up to whole seconds in the header)."""
    max_trajectories: int = 4096
    """Most trajectories held at once; finished ones beyond it are evicted oldest first (and exported first
    when ``export_path`` is set), a new one beyond it with live ones only is refused (429)."""
    trajectory_timeout_s: float = 600.0
    """A live trajectory with no call, reward or finish for this long is ended as failed ("harness silent"),
    so a crashed harness never holds a training group forever."""
    export_path: str = ""
    """A JSONL file every finished trajectory is appended to (ids, token ids, masks, log-probs, versions,
    reward); empty: none."""
    reward_fn: str = ""
    """A dotted path 'pkg.module:function' scoring a trajectory finished without a reward: called with the
    trajectory's messages (list of dicts) and returns a float. Empty: a finish without a reward is an error."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"serve.port must be in [0, 65535], got {self.port}")
        if self.tool_parser not in ("auto", "hermes", "llama3", "none"):
            raise ValueError(
                f"serve.tool_parser must be auto, hermes, llama3 or none, got {self.tool_parser!r}"
            )
        if self.chat_format not in CHAT_FORMATS:
            raise ValueError(f"serve.chat_format must be one of {CHAT_FORMATS}, got {self.chat_format!r}")
        for name in (
            "default_max_tokens",
            "max_tokens_limit",
            "max_n",
            "max_messages",
            "max_tools",
            "max_content_chars",
            "max_context_tokens",
            "max_body_bytes",
            "max_trajectories",
            "max_concurrent_calls",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"serve.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_stop < 0:
            raise ValueError(f"serve.max_stop must be >= 0, got {self.max_stop}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"serve.default_max_tokens={self.default_max_tokens} must be <= "
                f"serve.max_tokens_limit={self.max_tokens_limit}"
            )
        if self.retry_after_s <= 0:
            raise ValueError(f"serve.retry_after_s must be > 0, got {self.retry_after_s}")
        if not self.bind_timeout_s > 0:
            raise ValueError(f"serve.bind_timeout_s must be > 0, got {self.bind_timeout_s}")
        if self.trajectory_timeout_s <= 0:
            raise ValueError(f"serve.trajectory_timeout_s must be > 0, got {self.trajectory_timeout_s}")
        if self.reward_fn and ":" not in self.reward_fn:
            raise ValueError(
                f"serve.reward_fn must be a dotted path 'pkg.module:function', got {self.reward_fn!r}"
            )
