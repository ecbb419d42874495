"""A Hugging Face model directory written from weights that arrive a bucket at a time.

Why not ``save_pretrained``: it needs the whole model in memory, and the writers here never have it (a sharded
trainer's gathered buckets, a sharded checkpoint read back bucket by bucket). Each bucket becomes one
safetensors file as it arrives, and the index, config, generation config and tokenizer follow, so
``AutoModelForCausalLM.from_pretrained`` and vLLM load the directory as they load a hub checkpoint.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME


def write_model_directory(
    buckets: Iterable[list[tuple[str, torch.Tensor]]],
    directory: Path,
    config: PretrainedConfig,
    dtype: torch.dtype,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    generation_config: GenerationConfig | None = None,
) -> None:
    """Write every ``(name, full tensor)`` of ``buckets`` into ``directory``, cast to ``dtype``: one
    ``model-<i>.safetensors`` per bucket (consumed one at a time, so the caller decides how much is held), the
    index of which file holds which tensor, ``config`` with its dtype set to ``dtype``, and the generation
    config and tokenizer when given. A tied output layer (``config.tie_word_embeddings``) is the embedding:
    saved once, under the embedding's name, as ``from_pretrained`` expects."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    directory.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for index, bucket in enumerate(buckets):
        tensors = {
            name: tensor.to(dtype).contiguous()
            for name, tensor in bucket
            if not (tied and name == "lm_head.weight")
        }
        if not tensors:
            continue
        filename = f"model-{index:05d}.safetensors"
        save_file(tensors, directory / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, filename))
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
    config = copy.deepcopy(config)
    config.dtype = dtype
    config.save_pretrained(directory)
    index_json = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / SAFE_WEIGHTS_INDEX_NAME).write_text(json.dumps(index_json, indent=2) + "\n")
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
