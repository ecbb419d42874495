"""Configuration of the policy model: where its weights live, their dtype, and the device to run on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")

ModelKeys = tuple[str, str]
"""The config keys that name a model's path and its revision: what a failure to resolve them names."""
MODEL_KEYS: ModelKeys = ("model.path", "model.revision")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Which causal LM to load and how; the same model serves the engine and the trainer."""

    path: str = ""
    """Hugging Face model directory (config, safetensors weights, tokenizer), the name of a warm start shipped
    in ``asyncrl/assets`` (``tiny-copy``, ``tiny-count``), or a hub id (``Qwen/Qwen3-1.7B``) resolved through
    ``huggingface_hub`` into the standard cache (``HF_HOME``; offline with ``HF_HUB_OFFLINE=1``). Empty: the
    embedded default ``tiny-copy`` (reproduced by ``asyncrl sft``)."""
    revision: str = ""
    """Hub ids: the branch, tag or commit to load (pin a commit for a reproducible run); empty: ``main``.
    An error with a local directory."""
    local_files_only: bool = False
    """Hub ids: never download, load only what the hub cache holds (as ``HF_HUB_OFFLINE=1`` does); a model
    missing from the cache is an error naming the id and the cache."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype after loading. float32 on CPU; bfloat16 is the usual choice on GPUs."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs: auto takes cuda when a GPU is visible, else cpu."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {', '.join(map(repr, DTYPES))}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(
                f"model.device must be one of {', '.join(map(repr, DEVICES))}, got {self.device!r}"
            )
