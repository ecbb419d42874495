"""The built-in continuous-batching engine: ``LLMEngine`` (synchronous core) and ``AsyncEngine`` (asyncio API)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from asyncrl.config.engine import EngineConfig
    from asyncrl.config.model import ModelConfig
    from asyncrl.engine.async_engine import AsyncEngine
    from asyncrl.engine.capture_turns import CaptureTurns


def make_engine(
    model: torch.nn.Module,
    tokenizer: Any,
    config: EngineConfig,
    num_threads: int | None = None,
    *,
    asleep: int = 0,
    device: torch.device | None = None,
    capture_turns: CaptureTurns | None = None,
) -> AsyncEngine:
    """An ``AsyncEngine`` serving ``model`` on its own device and thread (``num_threads`` torch threads there;
    default: the caller's count), in ``config.dtype`` (``LLMEngine`` casts ``model`` in place when it differs:
    pass a model of the engine's own); call ``shutdown()`` when done. ``asleep``: start asleep at that level,
    the KV pool not allocated until ``wake`` (``LLMEngine``; a replacement under ``runtime.switch``);
    ``device``: where it serves, for a model still in host memory that starts asleep at level 2 (``LLMEngine``);
    ``capture_turns``: shared with a trainer on its device in this process (``engine.capture_turns``)."""
    from asyncrl.engine.async_engine import AsyncEngine
    from asyncrl.engine.llm_engine import LLMEngine

    core = LLMEngine(model, tokenizer, config, asleep=asleep, device=device, capture_turns=capture_turns)
    return AsyncEngine(core, num_threads=num_threads)


def load_engine_model(config: ModelConfig, asleep: int = 0) -> tuple[torch.nn.Module, Any, torch.device]:
    """The model a run's ``model`` section names, loaded for an engine that starts at sleep level ``asleep``
    (a replacement under ``runtime.switch``), its tokenizer, and the device it serves on (``model.device``
    resolved here: in an engine actor, where Ray placed it). At level 2 the weights are left in host memory,
    where that engine keeps them until its wake (``make_engine(device=)``): they never touch the device
    beside a colocated trainer's step, where the whole model in its dtype would land otherwise."""
    from asyncrl.models.loading import load_configured_model, resolve_device

    on_host = asleep == 2
    model, tokenizer = load_configured_model(config, on_host=on_host)
    device = resolve_device(config.device) if on_host else next(model.parameters()).device
    return model, tokenizer, device
