"""Tiny Qwen2- or Qwen3-architecture causal LMs, built from a config in code so tests and demos need no download.

Key decision: the real ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` classes (model_type qwen2 / qwen3), so every
path that loads a real checkpoint (``from_pretrained``, the engine's model runner, vLLM) runs unchanged on the
tiny one. Qwen3 is the shape of today's reasoning models (per-head q/k norms, no q/k/v bias, an explicit
``head_dim``); Qwen2 stays the default of the shipped checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from asyncrl.models.tokenizer import train_tokenizer

TINY_ARCHITECTURES = ("qwen2", "qwen3")
"""Model types ``build_tiny_model`` builds."""


def build_tiny_model(
    *,
    architecture: str = "qwen2",
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    head_dim: int | None = None,
    vocab_size: int = 512,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    eos_token_id: int | None = 0,
    pad_token_id: int | None = 0,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised ``architecture`` (qwen2 or qwen3) causal LM, the same for the same arguments
    whatever the global RNG state.

    ``num_kv_heads`` defaults to ``num_heads`` (no grouped-query attention), ``intermediate_size`` to
    ``4 * hidden_size`` and ``head_dim`` (qwen3 only; qwen2 derives it) to ``hidden_size / num_heads``. With ``tie_word_embeddings`` the output layer shares the input embedding matrix;
    anything that copies weights by name must then still send ``lm_head.weight``
    (see ``asyncrl.models.loading.state_dict_for_sync``). The EOS/pad ids go into the generation config too,
    so Hugging Face ``generate`` stops where the engine does.
    """
    if architecture not in TINY_ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(TINY_ARCHITECTURES)}, got {architecture!r}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    if head_dim is not None and architecture != "qwen3":
        raise ValueError(f"head_dim is a qwen3 setting (qwen2 derives it), got architecture {architecture!r}")
    extra = {"head_dim": head_dim or hidden_size // num_heads} if architecture == "qwen3" else {}
    config = AutoConfig.for_model(
        architecture,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return model.eval()


def build_tiny(
    texts: Iterable[str], *, vocab_size: int = 512, **model_kwargs: object
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A tokenizer trained on ``texts`` and a tiny model sized to it, its EOS and pad ids taken from it."""
    tokenizer = train_tokenizer(texts, vocab_size)
    model = build_tiny_model(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **model_kwargs,  # type: ignore[arg-type]
    )
    return model, tokenizer
