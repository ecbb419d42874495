"""Tiny random causal LMs for tests: Qwen2 (tied, GQA, q/k/v bias) and Llama (untied, no bias).

One definition, so every test that needs "the tiny random model" builds the same one.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import transformers

TINY_VOCAB = 300


def device_under_test() -> torch.device:
    """Where device-aware tests run their models: ``ASYNCRL_TEST_DEVICE`` (default ``cpu``).

    Why an environment variable: ``scripts/gpu-smoke.sh`` reruns the same engine and packing tests with it set
    to ``cuda``, so the CUDA path is checked by the very assertions the CPU suite makes, not by a GPU-only copy.
    """
    return torch.device(os.environ.get("ASYNCRL_TEST_DEVICE", "cpu"))


_TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": TINY_VOCAB,
    "max_position_embeddings": 128,
    "initializer_range": 0.1,
    "eos_token_id": 2,
}


def tiny_qwen2(seed: int = 0) -> transformers.Qwen2ForCausalLM:
    """2 layers, hidden 64, 2 KV heads (GQA), tied embeddings; weights drawn from ``seed``."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(**_TINY_SHAPE, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(config).eval()


def tiny_llama(seed: int = 0) -> transformers.LlamaForCausalLM:
    """The same shape as Llama: untied output layer, no attention bias, full KV heads."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**_TINY_SHAPE, num_key_value_heads=4, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config).eval()


FAMILY_SHAPES = {
    "qwen2": {},
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen3": {"head_dim": 32},
    "gemma": {"head_dim": 32},
    "phi3": {"partial_rotary_factor": 0.5, "pad_token_id": 0, "bos_token_id": 1},
}
"""Per family, what its tiny test model sets beyond ``_TINY_SHAPE``: an explicit ``head_dim`` wider than
``hidden / heads`` (Qwen3, Gemma) so the engine cannot confuse the two, partial rotary (Phi-3), special ids
inside the tiny vocabulary."""


def tiny_family_model(
    model_type: str, *, tied: bool, num_kv_heads: int = 2, seed: int = 0, **config_overrides: Any
) -> transformers.PreTrainedModel:
    """A random tiny model of ``model_type`` (a key of ``FAMILY_SHAPES``) with GQA when ``num_kv_heads < 4``;
    ``config_overrides`` replace any config field (e.g. a rope with scaling)."""
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(
        model_type,
        **{**_TINY_SHAPE, **FAMILY_SHAPES[model_type], **config_overrides},
        num_key_value_heads=num_kv_heads,
        tie_word_embeddings=tied,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()
