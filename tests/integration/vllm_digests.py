"""What vLLM must serve after an update, as ``VLLMEngineClient.weight_digest`` reports it (vLLM's fused names):
shared by the vLLM tests that check an update bit for bit."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""vLLM's fused parameters and the checkpoint tensors stacked (along dim 0) into each."""


def served_digest(weights: Mapping[str, torch.Tensor], vllm_name: str) -> str:
    """sha256 of what vLLM must serve under ``vllm_name`` after the update (fused names stacked)."""
    for fused, parts in FUSED.items():
        if f".{fused}." in vllm_name:
            tensor = torch.cat([weights[vllm_name.replace(fused, part)] for part in parts])
            break
    else:
        tensor = weights[vllm_name]
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()
