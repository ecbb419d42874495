"""``engine.max_model_len`` when a run leaves it unset: the longest context its requests can need.

Key decision: the built-in engine preallocates every slot's longest context up front, so defaulting to the
model's whole window (32 k positions for Qwen2) asks for a KV pool of tens of GiB that the run never touches,
and the engine refuses it (``engine.llm_engine.check_kv_pool_fits``). The run already knows its bound before
any engine starts: an RLVR request is at most its prompt plus ``rollout.max_new_tokens``, and the task's
prompts (train and held-out) are all known; an agentic episode's context is at most
``env_manager.max_context_tokens``. So an unset ``max_model_len`` becomes that bound, capped by the window.
A set value is kept. The external producer's requests come from a harness whose lengths nobody knows ahead,
so it keeps the window, and so does vLLM, which pages its KV cache instead of preallocating it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from transformers import AutoConfig

from asyncrl.config.run import RunConfig
from asyncrl.data.base import prompt_token_ids
from asyncrl.data.registry import make_task
from asyncrl.models.loading import load_configured_tokenizer, model_dir


@dataclass(frozen=True)
class ContextBound:
    """The context length a run needs, and what it came from (said on the console at start)."""

    tokens: int
    why: str


def with_max_model_len(config: RunConfig) -> tuple[RunConfig, ContextBound | None]:
    """``config`` with ``engine.max_model_len`` set to the run's bound when it was unset (see the module
    docstring), and the bound; the config unchanged and None where it keeps the window."""
    if config.engine.max_model_len is not None or config.engine.backend != "builtin":
        return config, None
    bound = needed_context(config)
    if bound is None:
        return config, None
    directory = model_dir(config.model)
    window = AutoConfig.from_pretrained(directory, local_files_only=True).max_position_embeddings
    if bound.tokens >= window:
        return config, None
    return replace(config, engine=replace(config.engine, max_model_len=bound.tokens)), bound


def needed_context(config: RunConfig) -> ContextBound | None:
    """The longest context the run's requests can reach, or None when it is not known ahead (external)."""
    if config.producer == "agentic":
        assert config.env_manager is not None  # RunConfig fills it in for the agentic producer
        tokens = config.env_manager.max_context_tokens
        return ContextBound(tokens, f"env_manager.max_context_tokens {tokens}")
    if config.producer != "rlvr":
        return None
    tokenizer = load_configured_tokenizer(config.model)
    task = make_task(config.task)
    longest = max(
        (
            len(prompt_token_ids(sample, tokenizer))
            for split in ("train", "eval")
            for sample in task.split(split)
        ),
        default=0,
    )
    new = config.rollout.max_new_tokens
    return ContextBound(longest + new, f"longest prompt {longest} + rollout.max_new_tokens {new}")
