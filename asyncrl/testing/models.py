"""Tiny random causal LMs for tests: Qwen2 (tied, GQA, q/k/v bias) and Llama (untied, no bias).

One definition, so every test that needs "the tiny random model" builds the same one.
"""

from __future__ import annotations

import torch
import transformers

TINY_VOCAB = 300

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
