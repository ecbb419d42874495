"""Configuration of one built-in engine replica (continuous batching, KV budget, weight updates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How one engine replica schedules requests and manages its KV cache."""

    max_running_requests: int = 64
    """Most requests decoding at once; further requests wait in the queue."""
    max_kv_tokens: int = 65536
    """KV tokens reserved across running requests: a request is admitted only when its worst-case length,
    min(prompt + max_new_tokens, max_model_len), fits in what is left (no preemption is ever needed)."""
    max_prefill_tokens_per_step: int = 2048
    """Prompt tokens prefilled per engine step, so prefill interleaves with decoding."""
    max_model_len: int | None = None
    """Longest prompt + output allowed; None takes the model's max_position_embeddings. The KV pool holds
    max_running_requests slots of min(max_model_len, max_kv_tokens) positions each: set it to bound memory."""
    kv_on_update: Literal["keep", "recompute"] = "keep"
    """On a weight update, keep in-flight KV (computed by old weights) or recompute it under the new ones."""
    seed: int = 0
    """Base seed; a request without its own seed is seeded from this and its request id."""

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_kv_tokens", "max_prefill_tokens_per_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(
                f"engine.max_model_len must be >= 2 (a prompt token and an output token), got {self.max_model_len}"
            )
        if self.kv_on_update not in ("keep", "recompute"):
            raise ValueError(
                f"engine.kv_on_update must be one of 'keep', 'recompute', got {self.kv_on_update!r}"
            )
