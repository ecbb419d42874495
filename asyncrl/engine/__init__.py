"""The built-in continuous-batching engine: ``LLMEngine`` (synchronous core) and ``AsyncEngine`` (asyncio API)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine.async_engine import AsyncEngine


def make_engine(
    model: torch.nn.Module,
    tokenizer: Any,
    config: EngineConfig,
    num_threads: int | None = None,
    *,
    asleep: int = 0,
) -> AsyncEngine:
    """An ``AsyncEngine`` serving ``model`` on its own device and thread (``num_threads`` torch threads there;
    default: the caller's count), in ``config.dtype`` (``LLMEngine`` casts ``model`` in place when it differs:
    pass a model of the engine's own); call ``shutdown()`` when done. ``asleep``: start asleep at that level,
    the KV pool not allocated until ``wake`` (``LLMEngine``; a replacement under ``runtime.switch``)."""
    from asyncrl.engine.async_engine import AsyncEngine
    from asyncrl.engine.llm_engine import LLMEngine

    return AsyncEngine(LLMEngine(model, tokenizer, config, asleep=asleep), num_threads=num_threads)
